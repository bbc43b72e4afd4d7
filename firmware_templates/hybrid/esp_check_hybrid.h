// esp_check_hybrid.h -- ESP-NN optimized kernels everywhere except chosen op instances, which run
// esp-nn's ANSI C kernels (esp_nn_*_ansi). Written by esp-check (`esp-check hybrid`, docs/hybrid.md);
// the table of chosen ops is in esp_check_hybrid.cc, generated for one model.
//
// Use: add esp_check_hybrid.cc to your component's SRCS and register the wrapped kernels in your own
// resolver, e.g.
//     resolver.AddConv2D(esp_check_hybrid::Register_CONV_2D());
// Every other op kind, and every op of a wrapped kind that is not in the table, runs exactly the
// esp-tflite-micro (ESP-NN) kernel it runs without this file.
#pragma once

#include <stdint.h>

#include "tensorflow/lite/micro/micro_common.h"

namespace esp_check_hybrid {

// The esp-tflite-micro registration of the op, with the table's nodes dispatched to ANSI C.
TFLMRegistration Register_CONV_2D();
TFLMRegistration Register_DEPTHWISE_CONV_2D();
TFLMRegistration Register_ADD();
TFLMRegistration Register_MUL();
TFLMRegistration Register_FULLY_CONNECTED();
TFLMRegistration Register_AVERAGE_POOL_2D();
TFLMRegistration Register_MAX_POOL_2D();
TFLMRegistration Register_SOFTMAX();

// The table: how many op instances run ANSI C, and the node index (execution order in subgraph 0) of
// the k-th (-1 when k is out of range).
int NumAnsiOps();
int AnsiOp(int k);

// Evidence for the host: invokes dispatched to an esp_nn_*_ansi kernel, and invokes of table nodes that
// ran the original kernel because ESP-NN does not handle them (e.g. a broadcasting ADD), since the last
// ResetCounters().
uint32_t AnsiInvokes();
uint32_t FallbackInvokes();
void ResetCounters();

}  // namespace esp_check_hybrid
