// TEST FIXTURE standing in for TFLM's MicroPrintf (esp-check tests/data/native_components).
#pragma once
#include <stdio.h>
#define MicroPrintf(...) (printf(__VA_ARGS__), printf("\r\n"))
