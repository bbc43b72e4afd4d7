// TEST FIXTURE (TFLM stand-in): int8 SOFTMAX over the last dimension, in float, quantized with the
// output's scale and zero point. It never refuses (TFLM's reference kernel aborts on rows of 512 or
// more entries near their maximum); esp-check's tests use it to see flash-and-compare report a host
// reference that refuses while both variants return values.
#include <math.h>

#include "tensorflow/lite/micro/kernels/kernels.h"

namespace tflite {
namespace {

TfLiteStatus Eval(TfLiteContext* context, TfLiteNode* node) {
  const FixtureSoftmaxParams* p = static_cast<const FixtureSoftmaxParams*>(node->builtin_data);
  const TfLiteEvalTensor* in = context->GetEvalTensor(context, node->inputs->data[0]);
  TfLiteEvalTensor* out = context->GetEvalTensor(context, node->outputs->data[0]);
  if (p == nullptr || in == nullptr || out == nullptr || in->type != kTfLiteInt8 || out->type != kTfLiteInt8 ||
      in->dims->size < 1 || p->output_scale <= 0.0f) {
    return kTfLiteError;
  }
  size_t count = 1, out_count = 1;
  for (int d = 0; d < in->dims->size; ++d) count *= static_cast<size_t>(in->dims->data[d]);
  for (int d = 0; d < out->dims->size; ++d) out_count *= static_cast<size_t>(out->dims->data[d]);
  const size_t depth = static_cast<size_t>(in->dims->data[in->dims->size - 1]);
  if (depth == 0 || count != out_count || count % depth != 0) return kTfLiteError;
  for (size_t row = 0; row < count; row += depth) {
    const int8_t* x = in->data.int8 + row;
    int8_t* y = out->data.int8 + row;
    int8_t max = x[0];
    for (size_t i = 1; i < depth; ++i) max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (size_t i = 0; i < depth; ++i) sum += exp(static_cast<double>(p->beta * p->input_scale) * (x[i] - max));
    for (size_t i = 0; i < depth; ++i) {
      const double prob = exp(static_cast<double>(p->beta * p->input_scale) * (x[i] - max)) / sum;
      long q = lround(prob / static_cast<double>(p->output_scale)) + p->output_zero_point;
      y[i] = static_cast<int8_t>(q < -128 ? -128 : (q > 127 ? 127 : q));
    }
  }
  return kTfLiteOk;
}

}  // namespace

TFLMRegistration Register_SOFTMAX() { return TFLMRegistration{nullptr, Eval, 0}; }

}  // namespace tflite
