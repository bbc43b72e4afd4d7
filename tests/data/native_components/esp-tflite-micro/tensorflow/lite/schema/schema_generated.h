// TEST FIXTURE standing in for TFLite's schema header (esp-check tests/data/native_components):
// builtin operator codes as in the TFLite schema, and Model::version() read from the flatbuffer.
#pragma once
#include <stdint.h>
#include <string.h>

#define TFLITE_SCHEMA_VERSION (3)

namespace tflite {

enum BuiltinOperator : int32_t {
  BuiltinOperator_ADD = 0,
  BuiltinOperator_AVERAGE_POOL_2D = 1,
  BuiltinOperator_CONCATENATION = 2,
  BuiltinOperator_CONV_2D = 3,
  BuiltinOperator_DEPTHWISE_CONV_2D = 4,
  BuiltinOperator_FULLY_CONNECTED = 9,
  BuiltinOperator_LOGISTIC = 14,
  BuiltinOperator_MAX_POOL_2D = 17,
  BuiltinOperator_MUL = 18,
  BuiltinOperator_RELU = 19,
  BuiltinOperator_RESHAPE = 22,
  BuiltinOperator_SOFTMAX = 25,
};

// A view of the model buffer: the flatbuffer's root table starts at the offset in its first 4 bytes.
struct Model {
  uint32_t version() const {
    const uint8_t* buf = reinterpret_cast<const uint8_t*>(this);
    uint32_t root_off;
    memcpy(&root_off, buf, 4);
    const uint8_t* table = buf + root_off;
    int32_t vt_rel;
    memcpy(&vt_rel, table, 4);
    const uint8_t* vtable = table - vt_rel;
    uint16_t vt_size, field_off = 0;
    memcpy(&vt_size, vtable, 2);
    if (vt_size > 4) memcpy(&field_off, vtable + 4, 2);
    uint32_t v = 0;
    if (field_off != 0) memcpy(&v, table + field_off, 4);
    return v;
  }
};

inline const Model* GetModel(const void* buf) { return static_cast<const Model*>(buf); }

}  // namespace tflite
