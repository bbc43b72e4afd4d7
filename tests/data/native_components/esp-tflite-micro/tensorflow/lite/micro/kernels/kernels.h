// TEST FIXTURE: the ops this stand-in TFLM has (esp-check tests/data/native_components).
#pragma once
#include "tensorflow/lite/micro/micro_common.h"

namespace tflite {
TFLMRegistration Register_MAX_POOL_2D();
TFLMRegistration Register_RESHAPE();
TFLMRegistration Register_SOFTMAX();

// What the fixture interpreter gives SOFTMAX as builtin_data (its eval tensors carry no scales).
struct FixtureSoftmaxParams {
  float beta;
  float input_scale;
  float output_scale;
  int32_t output_zero_point;
};
}  // namespace tflite
