// TEST FIXTURE (TFLM stand-in): the reference pooling kernel that the component's CMakeLists.txt
// removes in favour of kernels/esp_nn/pooling.cc, as esp-tflite-micro does. If the build-system
// stand-in compiled it anyway, Register_MAX_POOL_2D would be defined twice and the link would fail.
#include "tensorflow/lite/micro/kernels/kernels.h"

namespace tflite {
TFLMRegistration Register_MAX_POOL_2D() { return TFLMRegistration{nullptr, nullptr, 0}; }
}  // namespace tflite
