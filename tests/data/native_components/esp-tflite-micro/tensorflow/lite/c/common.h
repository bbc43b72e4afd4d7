// TEST FIXTURE standing in for TFLM's C types (esp-check tests/data/native_components).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { kTfLiteOk = 0, kTfLiteError = 1 } TfLiteStatus;
typedef enum {
  kTfLiteNoType = 0,
  kTfLiteFloat32 = 1,
  kTfLiteInt32 = 2,
  kTfLiteUInt8 = 3,
  kTfLiteInt64 = 4,
  kTfLiteInt16 = 7,
  kTfLiteInt8 = 9,
} TfLiteType;

typedef struct TfLiteIntArray {
  int size;
  int data[];
} TfLiteIntArray;

typedef struct {
  float scale;
  int32_t zero_point;
} TfLiteQuantizationParams;

typedef union {
  int32_t* i32;
  float* f;
  char* raw;
  const char* raw_const;
  uint8_t* uint8;
  int8_t* int8;
  int16_t* i16;
} TfLitePtrUnion;

typedef struct {
  TfLiteType type;
  TfLitePtrUnion data;
  TfLiteIntArray* dims;
  TfLiteQuantizationParams params;
  size_t bytes;
} TfLiteTensor;

typedef struct {
  TfLitePtrUnion data;
  TfLiteIntArray* dims;
  TfLiteType type;
} TfLiteEvalTensor;

typedef struct {
  TfLiteIntArray* inputs;
  TfLiteIntArray* outputs;
  void* builtin_data;
  void* user_data;
} TfLiteNode;

typedef struct TfLiteContext {
  TfLiteEvalTensor* (*GetEvalTensor)(const struct TfLiteContext* context, int tensor_idx);
  void* impl_;
} TfLiteContext;

typedef enum { kTfLitePaddingSame = 1, kTfLitePaddingValid = 2 } TfLitePadding;
typedef enum { kTfLiteActNone = 0, kTfLiteActRelu = 1, kTfLiteActReluN1To1 = 2, kTfLiteActRelu6 = 3 } TfLiteFusedActivation;

typedef struct {
  TfLitePadding padding;
  int stride_width;
  int stride_height;
  int filter_width;
  int filter_height;
  TfLiteFusedActivation activation;
} TfLitePoolParams;
