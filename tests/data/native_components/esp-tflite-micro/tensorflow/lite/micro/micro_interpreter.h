// TEST FIXTURE standing in for TFLM's MicroInterpreter (esp-check tests/data/native_components):
// the public methods the generated firmware calls, over a minimal flatbuffer reader.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/schema/schema_generated.h"

namespace tflite {

class MicroInterpreter {
 public:
  MicroInterpreter(const Model* model, const MicroOpResolver& op_resolver, uint8_t* tensor_arena,
                   size_t tensor_arena_size);
  TfLiteStatus AllocateTensors();
  TfLiteStatus Invoke();
  TfLiteTensor* input(size_t index);
  TfLiteTensor* output(size_t index);
  size_t inputs_size() const;
  size_t outputs_size() const;
  size_t arena_used_bytes() const { return used_; }

 private:
  struct Op {
    TfLiteNode node;
    const TFLMRegistration* registration;
  };
  void* Alloc(size_t bytes);
  TfLiteIntArray* IntArray(int size);
  static TfLiteEvalTensor* GetEvalTensor(const TfLiteContext* context, int tensor_idx);

  const uint8_t* model_;
  const MicroOpResolver& resolver_;
  uint8_t* arena_;
  size_t arena_size_;
  size_t used_ = 0;
  bool allocated_ = false;
  TfLiteContext context_ = {};
  TfLiteTensor* tensors_ = nullptr;
  TfLiteEvalTensor* eval_ = nullptr;
  Op* ops_ = nullptr;
  int num_tensors_ = 0;
  int num_ops_ = 0;
  TfLiteIntArray* inputs_ = nullptr;
  TfLiteIntArray* outputs_ = nullptr;
};

}  // namespace tflite
