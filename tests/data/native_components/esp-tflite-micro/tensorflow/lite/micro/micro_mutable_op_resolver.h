// TEST FIXTURE standing in for TFLM's MicroMutableOpResolver (esp-check tests/data/native_components):
// the same class template and method names, for the three ops the fixture has.
#pragma once
#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/micro/kernels/kernels.h"
#include "tensorflow/lite/micro/micro_common.h"
#include "tensorflow/lite/schema/schema_generated.h"

namespace tflite {

class MicroOpResolver {
 public:
  virtual ~MicroOpResolver() = default;
  virtual const TFLMRegistration* FindOp(BuiltinOperator op) const = 0;
  virtual const TFLMRegistration* FindOp(const char* op) const = 0;
};

template <unsigned int tOpCount>
class MicroMutableOpResolver : public MicroOpResolver {
 public:
  TfLiteStatus AddMaxPool2D() { return AddBuiltin(BuiltinOperator_MAX_POOL_2D, Register_MAX_POOL_2D()); }
  TfLiteStatus AddReshape() { return AddBuiltin(BuiltinOperator_RESHAPE, Register_RESHAPE()); }
  TfLiteStatus AddSoftmax() { return AddBuiltin(BuiltinOperator_SOFTMAX, Register_SOFTMAX()); }

  const TFLMRegistration* FindOp(BuiltinOperator op) const override {
    for (unsigned int i = 0; i < count_; ++i) {
      if (registrations_[i].builtin_code == op) return &registrations_[i];
    }
    return nullptr;
  }
  const TFLMRegistration* FindOp(const char* op) const override {
    (void)op;
    return nullptr;
  }

 private:
  TfLiteStatus AddBuiltin(BuiltinOperator op, TFLMRegistration registration) {
    if (count_ >= tOpCount || FindOp(op) != nullptr) return kTfLiteError;
    registration.builtin_code = op;
    registrations_[count_++] = registration;
    return kTfLiteOk;
  }
  TFLMRegistration registrations_[tOpCount] = {};
  unsigned int count_ = 0;
};

}  // namespace tflite
