// TEST FIXTURE: the ops this stand-in TFLM has (esp-check tests/data/native_components).
#pragma once
#include "tensorflow/lite/micro/micro_common.h"

namespace tflite {
TFLMRegistration Register_MAX_POOL_2D();
TFLMRegistration Register_RESHAPE();
}  // namespace tflite
