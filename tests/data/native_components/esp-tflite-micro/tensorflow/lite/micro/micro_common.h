// TEST FIXTURE standing in for TFLM's registration type (esp-check tests/data/native_components).
#pragma once
#include "tensorflow/lite/c/common.h"

struct TFLMRegistration {
  TfLiteStatus (*prepare)(TfLiteContext* context, TfLiteNode* node);
  TfLiteStatus (*invoke)(TfLiteContext* context, TfLiteNode* node);
  int32_t builtin_code;
};
