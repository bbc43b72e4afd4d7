// TEST FIXTURE (TFLM stand-in): MAX_POOL_2D through esp-nn, as esp-tflite-micro's
// kernels/esp_nn/pooling.cc does: <esp_timer.h> brings sdkconfig.h (the ESP-NN Kconfig choice), and
// <esp_nn.h> maps esp_nn_max_pool_s8 to the optimized or the ANSI C kernel.
#include <esp_timer.h>

#include <esp_nn.h>

#include "tensorflow/lite/micro/kernels/kernels.h"

namespace tflite {
namespace {

int OutSize(TfLitePadding padding, int in, int filter, int stride) {
  return padding == kTfLitePaddingSame ? (in + stride - 1) / stride : (in - filter + stride) / stride;
}

TfLiteStatus Eval(TfLiteContext* context, TfLiteNode* node) {
  const TfLitePoolParams* p = static_cast<const TfLitePoolParams*>(node->builtin_data);
  const TfLiteEvalTensor* in = context->GetEvalTensor(context, node->inputs->data[0]);
  TfLiteEvalTensor* out = context->GetEvalTensor(context, node->outputs->data[0]);
  if (p == nullptr || in == nullptr || out == nullptr || in->type != kTfLiteInt8 || in->dims->size != 4) {
    return kTfLiteError;
  }
  const int in_h = in->dims->data[1], in_w = in->dims->data[2], channels = in->dims->data[3];
  const int out_h = OutSize(p->padding, in_h, p->filter_height, p->stride_height);
  const int out_w = OutSize(p->padding, in_w, p->filter_width, p->stride_width);
  if (out_h != out->dims->data[1] || out_w != out->dims->data[2]) return kTfLiteError;
  int pad_h = ((out_h - 1) * p->stride_height + p->filter_height - in_h) / 2;
  int pad_w = ((out_w - 1) * p->stride_width + p->filter_width - in_w) / 2;
  pad_h = pad_h > 0 ? pad_h : 0;
  pad_w = pad_w > 0 ? pad_w : 0;
  if (p->activation != kTfLiteActNone) return kTfLiteError;  // the fixture models use none
  esp_nn_max_pool_s8(in->data.int8, static_cast<uint16_t>(in_w), static_cast<uint16_t>(in_h),
                     out->data.int8, static_cast<uint16_t>(out_w), static_cast<uint16_t>(out_h),
                     static_cast<uint16_t>(p->stride_width), static_cast<uint16_t>(p->stride_height),
                     static_cast<uint16_t>(p->filter_width), static_cast<uint16_t>(p->filter_height),
                     static_cast<uint16_t>(pad_w), static_cast<uint16_t>(pad_h), -128, 127,
                     static_cast<uint16_t>(channels));
  return kTfLiteOk;
}

}  // namespace

TFLMRegistration Register_MAX_POOL_2D() { return TFLMRegistration{nullptr, Eval, 0}; }

}  // namespace tflite
