/* esp-check kernel sweep driver (docs/sweep.md). Not firmware: a host program built by the native
 * target against the esp-nn sources under test (and esp-tflite-micro's reference kernels).
 *
 * stdin: one case per line, integers only: ID OP SEED LO HI PARAMS... (harness/analysis/sweep_cases.py
 * writes them). The op codes and each param's index per op (OP_CONV, CONV_IH, ..., CONV_N params then a
 * multiplier and a shift per output channel) are sweep_layout.h, which esp-check writes from the one
 * definition (sweep_cases.OPS and LAYOUT), so the two cannot disagree. Data comes from SEED
 * (sweep_value()), so esp-check can rebuild any case's tensors in Python for a reproduction.
 * stdout: one line per case, written after all three kernels returned:
 *   R ID OPT ANSI REF N CRC_OPT CRC_ANSI CRC_REF D_OA D_OR D_AR SCR_OPT SCR_ANSI ALIAS
 * OPT/ANSI/REF: 0 ran, 1 absent from these sources, 2 refused (a TFLM check aborted), 3 no
 * reference compiled in. D_XY: "count:max_abs:first_index" of the elements that differ (bit for bit).
 * ALIAS: 1 when CONFIG_NN_OPTIMIZED maps this kernel to the ANSI C function (the same code twice).
 * With ESP_CHECK_SWEEP_DUMP=1 in the environment, also "O ID opt_hex ansi_hex ref_hex".
 * Then "D ID" once the case's buffers are freed (the case is over).
 * Every buffer is allocated at exactly its size (so AddressSanitizer sees one element too far), scratch
 * exactly as esp-nn's getter asks (NULL for 0, as esp-tflite-micro does), outputs pre-filled with a
 * different pattern per variant (an element a kernel does not write shows up as a difference).
 * A line that is not a valid case ends the program with exit code 2. */
#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdkconfig.h"
#include "esp_nn.h"
#include "sweep_layout.h"
#if __has_include("esp_nn_defs.h")
#include "esp_nn_defs.h"
#define SWEEP_HAVE_DEFS 1
#endif

#if defined(ESP_CHECK_SWEEP_REFERENCE)
#include "tensorflow/lite/kernels/internal/reference/integer_ops/conv.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/depthwise_conv.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/fully_connected.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/add.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/mul.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/pooling.h"
#include "tensorflow/lite/kernels/internal/reference/softmax.h"
#endif

#define SWEEP_STR(x) #x
#define SWEEP_XSTR(x) SWEEP_STR(x)

extern "C" void app_main(void);

namespace {

enum { RAN = 0, ABSENT = 1, REFUSED = 2, NO_REF = 3 };
const int kMaxParams = 4200;
const int32_t kMaxElems = 1 << 24;

uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The value of element i of stream s (0 input, 1 second input / filter, 2 bias) of a case. */
uint64_t sweep_value(uint64_t seed, uint64_t stream, uint64_t i) {
  return mix((((seed << 4) | stream) << 32) | (i & 0xffffffffull));
}

/* Inputs (data, filter, bias) the kernels only read. Under AddressSanitizer they are exactly their size,
 * so one element too far is a report. Without it they are followed by a guard of kGuard bytes of
 * kGuardByte, so an out-of-bounds read gives the same values on every run (and in the standalone
 * reproduction, which does the same), not whatever the heap held. */
#if defined(__SANITIZE_ADDRESS__)
const size_t kGuard = 0;
#else
const size_t kGuard = 256;
#endif
const int kGuardByte = 0x5A;

void *input_alloc(size_t bytes) {
  void *p = malloc(bytes + kGuard > 0 ? bytes + kGuard : 1);
  memset(static_cast<char *>(p) + bytes, kGuardByte, kGuard);
  return p;
}

int8_t *fill_s8(uint64_t seed, uint64_t stream, int32_t n, int32_t lo, int32_t hi) {
  int8_t *p = static_cast<int8_t *>(input_alloc(n > 0 ? n : 0));
  uint64_t span = static_cast<uint64_t>(hi - lo + 1);
  for (int32_t i = 0; i < n; ++i) p[i] = static_cast<int8_t>(lo + static_cast<int32_t>(sweep_value(seed, stream, i) % span));
  return p;
}

int32_t *fill_s32(uint64_t seed, int32_t n, int32_t range) {
  int32_t *p = static_cast<int32_t *>(input_alloc(sizeof(int32_t) * (n > 0 ? n : 0)));
  uint64_t span = 2ull * static_cast<uint64_t>(range) + 1;
  for (int32_t i = 0; i < n; ++i) p[i] = -range + static_cast<int32_t>(sweep_value(seed, 2, i) % span);
  return p;
}

int8_t *out_buf(int32_t n, int pattern) {
  int8_t *p = static_cast<int8_t *>(malloc(n > 0 ? n : 1));
  memset(p, pattern, n > 0 ? n : 1);
  return p;
}

void *sym(const char *name) { return dlsym(RTLD_DEFAULT, name); }

struct Case {
  long id;
  int op;
  uint64_t seed;
  int32_t lo, hi;
  int32_t p[kMaxParams];
  int np;
};

struct Result {
  int status[3];  // opt, ansi, ref
  int32_t n;
  int8_t *out[3];
  int scratch[2];
  int alias;
};

/* Which of optimized, ANSI C and the reference run (ESP_CHECK_SWEEP_VARIANTS, letters o a r; all by
 * default). esp-check sanitizes each esp-nn variant in its own process, so one variant's sanitizer stop
 * never hides the other's. A variant that does not run is reported as absent ("-"). */
bool g_run[3] = {true, true, true};

sigjmp_buf g_abort_jmp;
volatile sig_atomic_t g_in_reference = 0;

void on_abort(int sig) {
  if (g_in_reference) siglongjmp(g_abort_jmp, 1);
  signal(sig, SIG_DFL);
  raise(sig);
}

void *scratch_alloc(int size) { return size > 0 ? malloc(static_cast<size_t>(size)) : nullptr; }

#if defined(SWEEP_HAVE_DEFS)
typedef void (*set_fn)(const void *);
#endif
typedef void (*fc_fn)(const int8_t *, int32_t, uint16_t, const int8_t *, int32_t, const int32_t *, int8_t *, uint16_t,
                      int32_t, int32_t, int32_t, int32_t, int32_t);
typedef void (*fc_ch_fn)(const int8_t *, int32_t, uint16_t, const int8_t *, int32_t, const int32_t *, int8_t *,
                         uint16_t, int32_t, const int32_t *, const int32_t *, int32_t, int32_t);
typedef void (*add_fn)(const int8_t *, const int8_t *, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t,
                       int8_t *, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t);
typedef void (*mul_fn)(const int8_t *, const int8_t *, int32_t, int32_t, int8_t *, int32_t, int32_t, int32_t, int32_t,
                       int32_t, int32_t);
typedef void (*pool_fn)(const int8_t *, uint16_t, uint16_t, int8_t *, uint16_t, uint16_t, uint16_t, uint16_t, uint16_t,
                        uint16_t, uint16_t, uint16_t, int32_t, int32_t, uint16_t);
typedef int32_t (*sm_size_fn)(int32_t, int32_t);
typedef void (*sm_set_fn)(void *);
typedef void (*sm_fn)(const int8_t *, int32_t, int32_t, int32_t, int32_t, int32_t, int8_t *);

/* The esp-nn names a variant calls: [0] what esp_nn.h maps the generic name to (the optimized variant),
 * [1] ANSI C. The slot order is the output order (R ID OPT ANSI REF ...): slot 0 is always optimized. */
struct Names {
  const char *fn[2], *size[2], *set[2];
};
const Names kConv = {{SWEEP_XSTR(esp_nn_conv_s8), "esp_nn_conv_s8_ansi"},
                     {SWEEP_XSTR(esp_nn_get_conv_scratch_size), "esp_nn_get_conv_scratch_size_ansi"},
                     {SWEEP_XSTR(esp_nn_set_conv_scratch_buf), "esp_nn_set_conv_scratch_buf_ansi"}};
const Names kDw = {{SWEEP_XSTR(esp_nn_depthwise_conv_s8), "esp_nn_depthwise_conv_s8_ansi"},
                   {SWEEP_XSTR(esp_nn_get_depthwise_conv_scratch_size), "esp_nn_get_depthwise_conv_scratch_size_ansi"},
                   {SWEEP_XSTR(esp_nn_set_depthwise_conv_scratch_buf), "esp_nn_set_depthwise_conv_scratch_buf_ansi"}};
#if defined(SWEEP_HAVE_DEFS)
/* Both esp-nn variants of a conv-shaped kernel (conv, depthwise: Params is their params struct): scratch
 * exactly as the variant's own getter asks, handed over through its setter, freed after the call. */
template <typename Params>
void run_conv_variants(const Names &k, Result &r, const data_dims_t &in_d, const int8_t *in, const data_dims_t &f_d,
                       const int8_t *filt, const int32_t *bias, const data_dims_t &o_d, const Params &cp,
                       const quant_data_t &q) {
  typedef void (*kernel_fn)(const data_dims_t *, const int8_t *, const data_dims_t *, const int8_t *, const int32_t *,
                            const data_dims_t *, int8_t *, const Params *, const quant_data_t *);
  typedef int (*size_fn)(const data_dims_t *, const data_dims_t *, const data_dims_t *, const Params *);
  for (int v = 0; v < 2; ++v) {
    if (!g_run[v]) continue;
    kernel_fn fn = reinterpret_cast<kernel_fn>(sym(k.fn[v]));
    size_fn sz = reinterpret_cast<size_fn>(sym(k.size[v]));
    set_fn set = reinterpret_cast<set_fn>(sym(k.set[v]));
    if (!fn) continue;
    r.scratch[v] = sz ? sz(&in_d, &f_d, &o_d, &cp) : 0;
    void *scratch = scratch_alloc(r.scratch[v]);
    if (set) set(scratch);
    fn(&in_d, in, &f_d, filt, bias, &o_d, r.out[v], &cp, &q);
    if (set) set(nullptr);
    free(scratch);
    r.status[v] = RAN;
  }
}
#endif
const char *const kFc[2] = {SWEEP_XSTR(esp_nn_fully_connected_s8), "esp_nn_fully_connected_s8_ansi"};
const char *const kFcCh[2] = {SWEEP_XSTR(esp_nn_fully_connected_per_ch_s8), "esp_nn_fully_connected_per_ch_s8_ansi"};
const char *const kAdd[2] = {SWEEP_XSTR(esp_nn_add_elementwise_s8), "esp_nn_add_elementwise_s8_ansi"};
const char *const kMul[2] = {SWEEP_XSTR(esp_nn_mul_elementwise_s8), "esp_nn_mul_elementwise_s8_ansi"};
const char *const kAvg[2] = {SWEEP_XSTR(esp_nn_avg_pool_s8), "esp_nn_avg_pool_s8_ansi"};
const char *const kMax[2] = {SWEEP_XSTR(esp_nn_max_pool_s8), "esp_nn_max_pool_s8_ansi"};
const Names kSoftmax = {{SWEEP_XSTR(esp_nn_softmax_s8), "esp_nn_softmax_s8_ansi"},
                        {SWEEP_XSTR(esp_nn_get_softmax_scratch_size), "esp_nn_get_softmax_scratch_size_ansi"},
                        {SWEEP_XSTR(esp_nn_set_softmax_scratch_buf), "esp_nn_set_softmax_scratch_buf_ansi"}};

void start(Result &r, int32_t n) {
  r.n = n;
  r.out[0] = out_buf(n, 0x55);
  r.out[1] = out_buf(n, 0xAA);
  r.out[2] = out_buf(n, 0x33);
  r.status[0] = r.status[1] = ABSENT;
  r.status[2] = NO_REF;
  r.scratch[0] = r.scratch[1] = 0;
}

#define REFERENCE(call)                        \
  do {                                         \
    if (!g_run[2]) break;                      \
    g_in_reference = 1;                        \
    if (sigsetjmp(g_abort_jmp, 1) == 0) {      \
      call;                                    \
      r.status[2] = RAN;                       \
    } else {                                   \
      r.status[2] = REFUSED;                   \
    }                                          \
    g_in_reference = 0;                        \
  } while (0)

void run_conv(const Case &c, Result &r) {
  const int32_t *p = c.p;
  int32_t ih = p[CONV_IH], iw = p[CONV_IW], ic = p[CONV_IC], fh = p[CONV_KH], fw = p[CONV_KW], fc = p[CONV_FC];
  int32_t oc = p[CONV_OC], oh = p[CONV_OH], ow = p[CONV_OW];
  start(r, oh * ow * oc);
  int8_t *in = fill_s8(c.seed, 0, ih * iw * ic, c.lo, c.hi);
  int8_t *filt = fill_s8(c.seed, 1, oc * fh * fw * fc, -127, 127);
  int32_t *bias = fill_s32(c.seed, oc, p[CONV_BIAS_RANGE]);
  int32_t *mult = static_cast<int32_t *>(input_alloc(sizeof(int32_t) * oc));
  int32_t *shift = static_cast<int32_t *>(input_alloc(sizeof(int32_t) * oc));
  memcpy(mult, p + CONV_N, sizeof(int32_t) * oc);
  memcpy(shift, p + CONV_N + oc, sizeof(int32_t) * oc);
#if defined(SWEEP_HAVE_DEFS)
  data_dims_t in_d = {iw, ih, ic, 1}, f_d = {fw, fh, fc, 0}, o_d = {ow, oh, oc, 1};
  conv_params_t cp = {p[CONV_IN_OFF], p[CONV_OUT_ZP], {p[CONV_SW], p[CONV_SH]},
                      {p[CONV_PW], p[CONV_PH]}, {0, 0}, {p[CONV_AMIN], p[CONV_AMAX]}};
  quant_data_t q = {shift, mult};
  run_conv_variants(kConv, r, in_d, in, f_d, filt, bias, o_d, cp, q);
#endif
#if defined(ESP_CHECK_SWEEP_REFERENCE)
  tflite::ConvParams rp = {};
  rp.padding_values.width = p[CONV_PW];
  rp.padding_values.height = p[CONV_PH];
  rp.stride_width = p[CONV_SW];
  rp.stride_height = p[CONV_SH];
  rp.dilation_width_factor = rp.dilation_height_factor = 1;
  rp.input_offset = p[CONV_IN_OFF];
  rp.output_offset = p[CONV_OUT_ZP];
  rp.quantized_activation_min = p[CONV_AMIN];
  rp.quantized_activation_max = p[CONV_AMAX];
  int32_t is[4] = {1, ih, iw, ic}, fs[4] = {oc, fh, fw, fc}, bs[1] = {oc}, os[4] = {1, oh, ow, oc};
  REFERENCE(tflite::reference_integer_ops::ConvPerChannel(
      rp, mult, shift, tflite::RuntimeShape(4, is), in, tflite::RuntimeShape(4, fs), filt, tflite::RuntimeShape(1, bs),
      bias, tflite::RuntimeShape(4, os), r.out[2]));
#endif
  free(in), free(filt), free(bias), free(mult), free(shift);
}

/* out_c = in_c * mult_ch */
void run_dw(const Case &c, Result &r) {
  const int32_t *p = c.p;
  int32_t ih = p[DEPTHWISE_IH], iw = p[DEPTHWISE_IW], ic = p[DEPTHWISE_IC], fh = p[DEPTHWISE_KH];
  int32_t fw = p[DEPTHWISE_KW], cm = p[DEPTHWISE_MULT_CH], oh = p[DEPTHWISE_OH], ow = p[DEPTHWISE_OW], oc = ic * cm;
  start(r, oh * ow * oc);
  int8_t *in = fill_s8(c.seed, 0, ih * iw * ic, c.lo, c.hi);
  int8_t *filt = fill_s8(c.seed, 1, fh * fw * oc, -127, 127);
  int32_t *bias = fill_s32(c.seed, oc, p[DEPTHWISE_BIAS_RANGE]);
  int32_t *mult = static_cast<int32_t *>(input_alloc(sizeof(int32_t) * oc));
  int32_t *shift = static_cast<int32_t *>(input_alloc(sizeof(int32_t) * oc));
  memcpy(mult, p + DEPTHWISE_N, sizeof(int32_t) * oc);
  memcpy(shift, p + DEPTHWISE_N + oc, sizeof(int32_t) * oc);
#if defined(SWEEP_HAVE_DEFS)
  data_dims_t in_d = {iw, ih, ic, 1}, f_d = {fw, fh, oc, 1}, o_d = {ow, oh, oc, 1};
  dw_conv_params_t cp = {p[DEPTHWISE_IN_OFF], p[DEPTHWISE_OUT_ZP], cm, {p[DEPTHWISE_SW], p[DEPTHWISE_SH]},
                         {p[DEPTHWISE_PW], p[DEPTHWISE_PH]}, {0, 0}, {p[DEPTHWISE_AMIN], p[DEPTHWISE_AMAX]}};
  quant_data_t q = {shift, mult};
  run_conv_variants(kDw, r, in_d, in, f_d, filt, bias, o_d, cp, q);
#endif
#if defined(ESP_CHECK_SWEEP_REFERENCE)
  tflite::DepthwiseParams rp = {};
  rp.padding_values.width = p[DEPTHWISE_PW];
  rp.padding_values.height = p[DEPTHWISE_PH];
  rp.stride_width = p[DEPTHWISE_SW];
  rp.stride_height = p[DEPTHWISE_SH];
  rp.dilation_width_factor = rp.dilation_height_factor = 1;
  rp.depth_multiplier = cm;
  rp.input_offset = p[DEPTHWISE_IN_OFF];
  rp.output_offset = p[DEPTHWISE_OUT_ZP];
  rp.quantized_activation_min = p[DEPTHWISE_AMIN];
  rp.quantized_activation_max = p[DEPTHWISE_AMAX];
  int32_t is[4] = {1, ih, iw, ic}, fs[4] = {1, fh, fw, oc}, bs[1] = {oc}, os[4] = {1, oh, ow, oc};
  REFERENCE(tflite::reference_integer_ops::DepthwiseConvPerChannel(
      rp, mult, shift, tflite::RuntimeShape(4, is), in, tflite::RuntimeShape(4, fs), filt, tflite::RuntimeShape(1, bs),
      bias, tflite::RuntimeShape(4, os), r.out[2]));
#endif
  free(in), free(filt), free(bias), free(mult), free(shift);
}

/* mult[per_channel ? out_c : 1] shift[...] */
void run_fc(const Case &c, Result &r) {
  const int32_t *p = c.p;
  int32_t row = p[FULLY_CONNECTED_ROW], oc = p[FULLY_CONNECTED_OC], per_ch = p[FULLY_CONNECTED_PER_CHANNEL];
  int32_t nq = per_ch ? oc : 1, in_off = p[FULLY_CONNECTED_IN_OFF], w_off = p[FULLY_CONNECTED_W_OFF];
  int32_t out_zp = p[FULLY_CONNECTED_OUT_ZP], amin = p[FULLY_CONNECTED_AMIN], amax = p[FULLY_CONNECTED_AMAX];
  start(r, oc);
  int8_t *in = fill_s8(c.seed, 0, row, c.lo, c.hi);
  int8_t *filt = fill_s8(c.seed, 1, oc * row, -127, 127);
  int32_t *bias = fill_s32(c.seed, oc, p[FULLY_CONNECTED_BIAS_RANGE]);
  int32_t *mult = static_cast<int32_t *>(input_alloc(sizeof(int32_t) * nq));
  int32_t *shift = static_cast<int32_t *>(input_alloc(sizeof(int32_t) * nq));
  memcpy(mult, p + FULLY_CONNECTED_N, sizeof(int32_t) * nq);
  memcpy(shift, p + FULLY_CONNECTED_N + nq, sizeof(int32_t) * nq);
  for (int v = 0; v < 2; ++v) {
    if (!g_run[v]) continue;
    if (per_ch) {
      fc_ch_fn fn = reinterpret_cast<fc_ch_fn>(sym(kFcCh[v]));
      if (!fn) continue;
      fn(in, in_off, static_cast<uint16_t>(row), filt, w_off, bias, r.out[v], static_cast<uint16_t>(oc), out_zp, shift,
         mult, amin, amax);
    } else {
      fc_fn fn = reinterpret_cast<fc_fn>(sym(kFc[v]));
      if (!fn) continue;
      fn(in, in_off, static_cast<uint16_t>(row), filt, w_off, bias, r.out[v], static_cast<uint16_t>(oc), out_zp,
         shift[0], mult[0], amin, amax);
    }
    r.status[v] = RAN;
  }
#if defined(ESP_CHECK_SWEEP_REFERENCE)
  tflite::FullyConnectedParams rp = {};
  rp.input_offset = in_off;
  rp.weights_offset = w_off;
  rp.output_offset = out_zp;
  rp.output_multiplier = mult[0];
  rp.output_shift = shift[0];
  rp.quantized_activation_min = amin;
  rp.quantized_activation_max = amax;
  int32_t is[2] = {1, row}, fs[2] = {oc, row}, bs[1] = {oc}, os[2] = {1, oc};
  if (per_ch) {
    int *ishift = static_cast<int *>(malloc(sizeof(int) * nq));
    for (int k = 0; k < nq; ++k) ishift[k] = shift[k];
    REFERENCE((tflite::reference_integer_ops::FullyConnectedPerChannel<int8_t, int8_t, int8_t, int32_t>(
        rp, mult, ishift, tflite::RuntimeShape(2, is), in, tflite::RuntimeShape(2, fs), filt,
        tflite::RuntimeShape(1, bs), bias, tflite::RuntimeShape(2, os), r.out[2])));
    free(ishift);
  } else {
    REFERENCE((tflite::reference_integer_ops::FullyConnected<int8_t, int8_t, int8_t, int32_t>(
        rp, tflite::RuntimeShape(2, is), in, tflite::RuntimeShape(2, fs), filt, tflite::RuntimeShape(1, bs), bias,
        tflite::RuntimeShape(2, os), r.out[2])));
  }
#endif
  free(in), free(filt), free(bias), free(mult), free(shift);
}

void run_add_mul(const Case &c, Result &r) {
  const bool add = c.op == OP_ADD;
  const int32_t *p = c.p;
  int32_t n = p[add ? ADD_SIZE : MUL_SIZE], off1 = p[add ? ADD_IN1_OFF : MUL_IN1_OFF];
  int32_t off2 = p[add ? ADD_IN2_OFF : MUL_IN2_OFF], out_zp = p[add ? ADD_OUT_ZP : MUL_OUT_ZP];
  int32_t out_mult = p[add ? ADD_OUT_MULT : MUL_OUT_MULT], out_shift = p[add ? ADD_OUT_SHIFT : MUL_OUT_SHIFT];
  int32_t amin = p[add ? ADD_AMIN : MUL_AMIN], amax = p[add ? ADD_AMAX : MUL_AMAX];
  start(r, n);
  int8_t *a = fill_s8(c.seed, 0, n, c.lo, c.hi);
  int8_t *b = fill_s8(c.seed, 1, n, c.lo, c.hi);
  for (int v = 0; v < 2; ++v) {
    if (!g_run[v]) continue;
    if (add) {
      add_fn fn = reinterpret_cast<add_fn>(sym(kAdd[v]));
      if (!fn) continue;
      fn(a, b, off1, off2, p[ADD_MULT1], p[ADD_MULT2], p[ADD_SHIFT1], p[ADD_SHIFT2], p[ADD_LEFT_SHIFT], r.out[v],
         out_zp, out_mult, out_shift, amin, amax, n);
    } else {
      mul_fn fn = reinterpret_cast<mul_fn>(sym(kMul[v]));
      if (!fn) continue;
      fn(a, b, off1, off2, r.out[v], out_zp, out_mult, out_shift, amin, amax, n);
    }
    r.status[v] = RAN;
  }
#if defined(ESP_CHECK_SWEEP_REFERENCE)
  tflite::ArithmeticParams rp = {};
  rp.input1_offset = off1;
  rp.input2_offset = off2;
  rp.output_offset = out_zp;
  rp.output_multiplier = out_mult;
  rp.output_shift = out_shift;
  rp.quantized_activation_min = amin;
  rp.quantized_activation_max = amax;
  int32_t s[1] = {n};
  tflite::RuntimeShape sh(1, s);
  if (add) {
    rp.input1_multiplier = p[ADD_MULT1];
    rp.input2_multiplier = p[ADD_MULT2];
    rp.input1_shift = p[ADD_SHIFT1];
    rp.input2_shift = p[ADD_SHIFT2];
    rp.left_shift = p[ADD_LEFT_SHIFT];
    REFERENCE(tflite::reference_integer_ops::Add(rp, sh, a, sh, b, sh, r.out[2]));
  } else {
    REFERENCE(tflite::reference_integer_ops::Mul(rp, sh, a, sh, b, sh, r.out[2]));
  }
#endif
  free(a), free(b);
}

/* AVERAGE_POOL_2D / MAX_POOL_2D (one layout: sweep_layout.h has it once, as POOL_*) */
void run_pool(const Case &c, Result &r) {
  const int32_t *p = c.p;
  int32_t ih = p[POOL_IH], iw = p[POOL_IW], ch = p[POOL_CH], oh = p[POOL_OH], ow = p[POOL_OW];
  start(r, oh * ow * ch);
  int8_t *in = fill_s8(c.seed, 0, ih * iw * ch, c.lo, c.hi);
  const char *const *names = c.op == OP_AVG_POOL ? kAvg : kMax;
  for (int v = 0; v < 2; ++v) {
    if (!g_run[v]) continue;
    pool_fn fn = reinterpret_cast<pool_fn>(sym(names[v]));
    if (!fn) continue;
    fn(in, iw, ih, r.out[v], ow, oh, p[POOL_SW], p[POOL_SH], p[POOL_KW], p[POOL_KH], p[POOL_PW], p[POOL_PH],
       p[POOL_AMIN], p[POOL_AMAX], ch);
    r.status[v] = RAN;
  }
#if defined(ESP_CHECK_SWEEP_REFERENCE)
  tflite::PoolParams rp = {};
  rp.stride_height = p[POOL_SH];
  rp.stride_width = p[POOL_SW];
  rp.filter_height = p[POOL_KH];
  rp.filter_width = p[POOL_KW];
  rp.padding_values.height = p[POOL_PH];
  rp.padding_values.width = p[POOL_PW];
  rp.quantized_activation_min = p[POOL_AMIN];
  rp.quantized_activation_max = p[POOL_AMAX];
  int32_t is[4] = {1, ih, iw, ch}, os[4] = {1, oh, ow, ch};
  if (c.op == OP_AVG_POOL) {
    bool ok = true;
    REFERENCE(ok = tflite::reference_integer_ops::AveragePool(rp, tflite::RuntimeShape(4, is), in,
                                                              tflite::RuntimeShape(4, os), r.out[2]));
    if (!ok) r.status[2] = REFUSED;  // AveragePool returns false for a window with no element
  } else {
    REFERENCE(tflite::reference_integer_ops::MaxPool(rp, tflite::RuntimeShape(4, is), in, tflite::RuntimeShape(4, os),
                                                     r.out[2]));
  }
#endif
  free(in);
}

void run_softmax(const Case &c, Result &r) {
  const int32_t *p = c.p;
  int32_t rows = p[SOFTMAX_ROWS], depth = p[SOFTMAX_DEPTH];
  start(r, rows * depth);
  int8_t *in = fill_s8(c.seed, 0, rows * depth, c.lo, c.hi);
  for (int v = 0; v < 2; ++v) {
    if (!g_run[v]) continue;
    sm_fn fn = reinterpret_cast<sm_fn>(sym(kSoftmax.fn[v]));
    sm_size_fn sz = reinterpret_cast<sm_size_fn>(sym(kSoftmax.size[v]));
    sm_set_fn set = reinterpret_cast<sm_set_fn>(sym(kSoftmax.set[v]));
    if (!fn) continue;
    r.scratch[v] = sz ? sz(depth, rows) : 0;
    void *scratch = scratch_alloc(r.scratch[v]);
    if (set) set(scratch);
    fn(in, rows, depth, p[SOFTMAX_IN_MULT], p[SOFTMAX_IN_SHIFT], p[SOFTMAX_DIFF_MIN], r.out[v]);
    if (set) set(nullptr);
    free(scratch);
    r.status[v] = RAN;
  }
#if defined(ESP_CHECK_SWEEP_REFERENCE)
  tflite::SoftmaxParams rp = {};
  rp.input_multiplier = p[SOFTMAX_IN_MULT];
  rp.input_left_shift = p[SOFTMAX_IN_SHIFT];
  rp.diff_min = p[SOFTMAX_DIFF_MIN];
  int32_t s[2] = {rows, depth};
  REFERENCE((tflite::reference_ops::Softmax<int8_t, int8_t>(rp, tflite::RuntimeShape(2, s), in,
                                                            tflite::RuntimeShape(2, s), r.out[2])));
#endif
  free(in);
}

int alias_of(int op) {
  const char *const *pair = nullptr;
  switch (op) {
    case OP_CONV: pair = kConv.fn; break;
    case OP_DEPTHWISE: pair = kDw.fn; break;
    case OP_FULLY_CONNECTED: pair = kFc; break;
    case OP_ADD: pair = kAdd; break;
    case OP_MUL: pair = kMul; break;
    case OP_AVG_POOL: pair = kAvg; break;
    case OP_MAX_POOL: pair = kMax; break;
    case OP_SOFTMAX: pair = kSoftmax.fn; break;
    default: return 0;
  }
  void *a = sym(pair[0]), *b = sym(pair[1]);
  return a != nullptr && a == b;
}

uint32_t crc32(const int8_t *p, int32_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (int32_t i = 0; i < n; ++i) {
    c ^= static_cast<uint8_t>(p[i]);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void diff(const Result &r, int a, int b, char *out, size_t cap) {
  if (r.status[a] != RAN || r.status[b] != RAN) {
    snprintf(out, cap, "-");
    return;
  }
  int32_t count = 0, maxabs = 0, first = -1;
  for (int32_t i = 0; i < r.n; ++i) {
    int32_t d = r.out[a][i] - r.out[b][i];
    if (d) {
      if (first < 0) first = i;
      ++count;
      if ((d < 0 ? -d : d) > maxabs) maxabs = d < 0 ? -d : d;
    }
  }
  snprintf(out, cap, "%ld:%ld:%ld", static_cast<long>(count), static_cast<long>(maxabs), static_cast<long>(first));
}

bool read_case(Case &c) {
  static char line[65536];
  for (;;) {
    if (!fgets(line, sizeof line, stdin)) return false;
    if (line[0] != '\n' && line[0] != '#') break;
  }
  char *s = line, *end = nullptr;
  long long v[5];
  for (int k = 0; k < 5; ++k) {
    v[k] = strtoll(s, &end, 10);
    if (end == s) {
      fprintf(stderr, "esp-check sweep: malformed case line\n");
      exit(2);
    }
    s = end;
  }
  c.id = static_cast<long>(v[0]);
  c.op = static_cast<int>(v[1]);
  c.seed = static_cast<uint64_t>(v[2]) & 0x0FFFFFFFull;
  c.lo = static_cast<int32_t>(v[3]);
  c.hi = static_cast<int32_t>(v[4]);
  if (c.lo < -128 || c.hi > 127 || c.lo > c.hi) {
    fprintf(stderr, "esp-check sweep: case %ld: input range %d..%d is not int8\n", c.id, c.lo, c.hi);
    exit(2);
  }
  c.np = 0;
  for (;;) {
    long long x = strtoll(s, &end, 10);
    if (end == s) break;
    if (c.np >= kMaxParams || x < INT32_MIN || x > INT32_MAX) {
      fprintf(stderr, "esp-check sweep: case %ld: too many or out-of-range parameters\n", c.id);
      exit(2);
    }
    c.p[c.np++] = static_cast<int32_t>(x);
    s = end;
  }
  return true;
}

/* Why a case cannot run (nullptr when it can), checked before any param is read past LAYOUT's or anything is
 * allocated (the input is not trusted): exactly LAYOUT's params then a multiplier and a shift per output
 * channel (one for a per-tensor fully connected case), sizes bounded. */
const char *invalid(const Case &c) {
  int dims = 0, named = 0;  // params 0..dims-1 are sizes, strides or padding: 0..65535
  switch (c.op) {
    case OP_CONV: dims = CONV_IN_OFF, named = CONV_N; break;
    case OP_DEPTHWISE: dims = DEPTHWISE_IN_OFF, named = DEPTHWISE_N; break;
    case OP_FULLY_CONNECTED: dims = FULLY_CONNECTED_IN_OFF, named = FULLY_CONNECTED_N; break;
    case OP_ADD: dims = ADD_IN1_OFF, named = ADD_N; break;
    case OP_MUL: dims = MUL_IN1_OFF, named = MUL_N; break;
    case OP_AVG_POOL: case OP_MAX_POOL: dims = POOL_AMIN, named = POOL_N; break;
    case OP_SOFTMAX: dims = SOFTMAX_IN_MULT, named = SOFTMAX_N; break;
    default: return "unknown op";
  }
  if (c.np < named) return "too few parameters for its op";
  for (int k = 0; k < dims; ++k)
    if (c.p[k] < 0 || c.p[k] > 65535) return "geometry out of bounds";
  long long n = 0, channels = 0;
  const int32_t *p = c.p;
  switch (c.op) {
    case OP_CONV:
      channels = p[CONV_OC];
      n = channels * (1LL * p[CONV_KH] * p[CONV_KW] * p[CONV_FC] + 1LL * p[CONV_OH] * p[CONV_OW]) +
          1LL * p[CONV_IH] * p[CONV_IW] * p[CONV_IC];
      break;
    case OP_DEPTHWISE:
      channels = 1LL * p[DEPTHWISE_IC] * p[DEPTHWISE_MULT_CH];
      n = channels * (1LL * p[DEPTHWISE_KH] * p[DEPTHWISE_KW] + 1LL * p[DEPTHWISE_OH] * p[DEPTHWISE_OW]) +
          1LL * p[DEPTHWISE_IH] * p[DEPTHWISE_IW] * p[DEPTHWISE_IC];
      break;
    case OP_FULLY_CONNECTED:
      channels = p[FULLY_CONNECTED_PER_CHANNEL] ? p[FULLY_CONNECTED_OC] : 1;
      n = 1LL * p[FULLY_CONNECTED_ROW] * p[FULLY_CONNECTED_OC];
      break;
    case OP_ADD: n = p[ADD_SIZE]; break;
    case OP_MUL: n = p[MUL_SIZE]; break;
    case OP_AVG_POOL: case OP_MAX_POOL:
      n = 1LL * p[POOL_CH] * (1LL * p[POOL_IH] * p[POOL_IW] + 1LL * p[POOL_OH] * p[POOL_OW]);
      break;
    default: n = 1LL * p[SOFTMAX_ROWS] * p[SOFTMAX_DEPTH]; break;
  }
  if (c.np != named + 2 * channels) return "wrong number of parameters for its op and channels";
  return n <= kMaxElems ? nullptr : "geometry out of bounds";
}

void hex(const Result &r, int v) {
  putchar(' ');
  if (r.status[v] != RAN) {
    putchar('-');
    return;
  }
  for (int32_t i = 0; i < r.n; ++i) printf("%02x", static_cast<uint8_t>(r.out[v][i]));
}

}  // namespace

extern "C" void app_main(void) {
  signal(SIGABRT, on_abort);
  const char *dump_env = getenv("ESP_CHECK_SWEEP_DUMP");
  const bool dump = dump_env && dump_env[0] == '1';
  const char *variants = getenv("ESP_CHECK_SWEEP_VARIANTS");
  if (variants) {
    g_run[0] = strchr(variants, 'o') != nullptr;
    g_run[1] = strchr(variants, 'a') != nullptr;
    g_run[2] = strchr(variants, 'r') != nullptr;
  }
  static Case c;
  printf("SWEEP-DRIVER 1 reference=%d\n",
#if defined(ESP_CHECK_SWEEP_REFERENCE)
         1
#else
         0
#endif
  );
  while (read_case(c)) {
    if (const char *why = invalid(c)) {
      fprintf(stderr, "esp-check sweep: case %ld (op %d, %d parameters): %s\n", c.id, c.op, c.np, why);
      exit(2);
    }
    Result r = {};
    switch (c.op) {
      case OP_CONV: run_conv(c, r); break;
      case OP_DEPTHWISE: run_dw(c, r); break;
      case OP_FULLY_CONNECTED: run_fc(c, r); break;
      case OP_ADD: case OP_MUL: run_add_mul(c, r); break;
      case OP_AVG_POOL: case OP_MAX_POOL: run_pool(c, r); break;
      case OP_SOFTMAX: run_softmax(c, r); break;
    }
    char oa[64], orf[64], ar[64];
    diff(r, 0, 1, oa, sizeof oa);
    diff(r, 0, 2, orf, sizeof orf);
    diff(r, 1, 2, ar, sizeof ar);
    printf("R %ld %d %d %d %ld %08x %08x %08x %s %s %s %d %d %d\n", c.id, r.status[0], r.status[1], r.status[2],
           static_cast<long>(r.n), crc32(r.out[0], r.n), crc32(r.out[1], r.n), crc32(r.out[2], r.n), oa, orf, ar,
           r.scratch[0], r.scratch[1], alias_of(c.op));
    if (dump) {
      printf("O %ld", c.id);
      hex(r, 0), hex(r, 1), hex(r, 2);
      putchar('\n');
    }
    fflush(stdout);
    for (int v = 0; v < 3; ++v) free(r.out[v]);
    /* The case is over only once its buffers are freed: glibc may abort in free() on a heap a kernel
     * overran. esp-check blames a death on the first case without this line. */
    printf("D %ld\n", c.id);
    fflush(stdout);
  }
}
