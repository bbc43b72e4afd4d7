// TEST FIXTURE standing in for TFLM's interpreter (esp-check tests/data/native_components).
// Reads one-subgraph .tflite flatbuffers (tensors, buffers, operators, Pool2DOptions, SoftmaxOptions), places every
// non-constant tensor in the arena, and runs the ops in order through their registrations. It trusts
// the model: it is only ever given the test suite's own models.
#include "tensorflow/lite/micro/micro_interpreter.h"

#include <string.h>

#include "tensorflow/lite/micro/micro_log.h"

namespace tflite {
namespace {

uint32_t U32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
int32_t I32(const uint8_t* p) { int32_t v; memcpy(&v, p, 4); return v; }
uint16_t U16(const uint8_t* p) { uint16_t v; memcpy(&v, p, 2); return v; }

struct Vec {
  const uint8_t* data = nullptr;
  uint32_t size = 0;
  int32_t Int(uint32_t k) const { return I32(data + 4 * k); }
  float Float(uint32_t k) const { float v; memcpy(&v, data + 4 * k, 4); return v; }
  int64_t Int64(uint32_t k) const { int64_t v; memcpy(&v, data + 8 * k, 8); return v; }
};

struct Table {
  const uint8_t* p = nullptr;
  const uint8_t* Field(int id) const {
    if (p == nullptr) return nullptr;
    const uint8_t* vt = p - I32(p);
    const uint16_t pos = static_cast<uint16_t>(4 + 2 * id);
    if (pos + 2 > U16(vt)) return nullptr;
    const uint16_t off = U16(vt + pos);
    return off ? p + off : nullptr;
  }
  int32_t Int(int id, int32_t def) const { const uint8_t* f = Field(id); return f ? I32(f) : def; }
  int8_t Byte(int id, int8_t def) const { const uint8_t* f = Field(id); return f ? static_cast<int8_t>(*f) : def; }
  float Float(int id, float def) const {
    const uint8_t* f = Field(id);
    if (f == nullptr) return def;
    float v;
    memcpy(&v, f, 4);
    return v;
  }
  Table Sub(int id) const { const uint8_t* f = Field(id); return f ? Table{f + U32(f)} : Table{}; }
  Vec Vector(int id) const {
    const uint8_t* f = Field(id);
    if (f == nullptr) return Vec{};
    const uint8_t* v = f + U32(f);
    return Vec{v + 4, U32(v)};
  }
};

Table Element(const Vec& v, uint32_t k) { const uint8_t* e = v.data + 4 * k; return Table{e + U32(e)}; }

// TensorType (schema) -> TfLiteType, and element sizes.
TfLiteType ToType(int8_t t) {
  switch (t) {
    case 0: return kTfLiteFloat32;
    case 2: return kTfLiteInt32;
    case 3: return kTfLiteUInt8;
    case 7: return kTfLiteInt16;
    case 9: return kTfLiteInt8;
    default: return kTfLiteNoType;
  }
}
size_t ElementSize(TfLiteType t) {
  switch (t) {
    case kTfLiteFloat32: case kTfLiteInt32: return 4;
    case kTfLiteInt16: return 2;
    case kTfLiteUInt8: case kTfLiteInt8: return 1;
    default: return 0;
  }
}

}  // namespace

MicroInterpreter::MicroInterpreter(const Model* model, const MicroOpResolver& op_resolver,
                                   uint8_t* tensor_arena, size_t tensor_arena_size)
    : model_(reinterpret_cast<const uint8_t*>(model)), resolver_(op_resolver), arena_(tensor_arena),
      arena_size_(tensor_arena_size) {
  context_.GetEvalTensor = &MicroInterpreter::GetEvalTensor;
  context_.impl_ = this;
}

void* MicroInterpreter::Alloc(size_t bytes) {
  const size_t start = (used_ + 15u) & ~static_cast<size_t>(15u);
  if (start + bytes > arena_size_) {
    MicroPrintf("Failed to allocate memory. Requested: %u, available %u", static_cast<unsigned>(bytes),
                static_cast<unsigned>(arena_size_ - (start < arena_size_ ? start : arena_size_)));
    return nullptr;
  }
  used_ = start + bytes;
  return arena_ + start;
}

TfLiteIntArray* MicroInterpreter::IntArray(int size) {
  TfLiteIntArray* a = static_cast<TfLiteIntArray*>(Alloc(sizeof(int) * static_cast<size_t>(size + 1)));
  if (a != nullptr) a->size = size;
  return a;
}

TfLiteEvalTensor* MicroInterpreter::GetEvalTensor(const TfLiteContext* context, int tensor_idx) {
  const MicroInterpreter* self = static_cast<const MicroInterpreter*>(context->impl_);
  if (tensor_idx < 0 || tensor_idx >= self->num_tensors_) return nullptr;
  return &self->eval_[tensor_idx];
}

TfLiteStatus MicroInterpreter::AllocateTensors() {
  const Table model{model_ + U32(model_)};
  const Vec subgraphs = model.Vector(2);
  if (subgraphs.size != 1) {
    MicroPrintf("Only 1 subgraph is currently supported.");
    return kTfLiteError;
  }
  const Table sg = Element(subgraphs, 0);
  const Vec tensors = sg.Vector(0);
  const Vec buffers = model.Vector(4);
  const Vec codes = model.Vector(1);
  const Vec operators = sg.Vector(3);
  num_tensors_ = static_cast<int>(tensors.size);
  num_ops_ = static_cast<int>(operators.size);
  tensors_ = static_cast<TfLiteTensor*>(Alloc(sizeof(TfLiteTensor) * tensors.size));
  eval_ = static_cast<TfLiteEvalTensor*>(Alloc(sizeof(TfLiteEvalTensor) * tensors.size));
  ops_ = static_cast<Op*>(Alloc(sizeof(Op) * (operators.size ? operators.size : 1)));
  if (tensors_ == nullptr || eval_ == nullptr || ops_ == nullptr) return kTfLiteError;
  for (uint32_t i = 0; i < tensors.size; ++i) {
    const Table t = Element(tensors, i);
    const Vec shape = t.Vector(0);
    TfLiteTensor& tensor = tensors_[i];
    tensor.type = ToType(t.Byte(1, 0));
    tensor.dims = IntArray(static_cast<int>(shape.size));
    if (tensor.dims == nullptr) return kTfLiteError;
    size_t count = 1;
    for (uint32_t d = 0; d < shape.size; ++d) {
      tensor.dims->data[d] = shape.Int(d);
      count *= static_cast<size_t>(shape.Int(d));
    }
    tensor.bytes = count * ElementSize(tensor.type);
    const Table q = t.Sub(4);
    const Vec scale = q.Vector(2);
    const Vec zp = q.Vector(3);
    tensor.params.scale = scale.size ? scale.Float(0) : 0.0f;
    tensor.params.zero_point = zp.size ? static_cast<int32_t>(zp.Int64(0)) : 0;
    const uint32_t buffer = static_cast<uint32_t>(t.Int(2, 0));
    const Vec constant = buffer < buffers.size ? Element(buffers, buffer).Vector(0) : Vec{};
    if (constant.size > 0) {
      tensor.data.raw_const = reinterpret_cast<const char*>(constant.data);
    } else {
      tensor.data.raw = static_cast<char*>(Alloc(tensor.bytes));
      if (tensor.data.raw == nullptr) return kTfLiteError;
    }
    eval_[i] = TfLiteEvalTensor{tensor.data, tensor.dims, tensor.type};
  }
  for (uint32_t k = 0; k < operators.size; ++k) {
    const Table op = Element(operators, k);
    const Table code = Element(codes, static_cast<uint32_t>(op.Int(0, 0)));
    int32_t builtin = code.Int(3, 0);
    const int32_t deprecated = code.Byte(0, 0);
    if (deprecated > builtin) builtin = deprecated;
    const TFLMRegistration* reg = resolver_.FindOp(static_cast<BuiltinOperator>(builtin));
    if (reg == nullptr) {
      MicroPrintf("Didn't find op for builtin opcode '%d'", static_cast<int>(builtin));
      return kTfLiteError;
    }
    Op& o = ops_[k];
    o.registration = reg;
    const Vec ins = op.Vector(1);
    const Vec outs = op.Vector(2);
    o.node.inputs = IntArray(static_cast<int>(ins.size));
    o.node.outputs = IntArray(static_cast<int>(outs.size));
    if (o.node.inputs == nullptr || o.node.outputs == nullptr) return kTfLiteError;
    for (uint32_t j = 0; j < ins.size; ++j) o.node.inputs->data[j] = ins.Int(j);
    for (uint32_t j = 0; j < outs.size; ++j) o.node.outputs->data[j] = outs.Int(j);
    o.node.builtin_data = nullptr;
    if (builtin == BuiltinOperator_MAX_POOL_2D) {
      const Table opt = op.Sub(4);  // Pool2DOptions
      TfLitePoolParams* p = static_cast<TfLitePoolParams*>(Alloc(sizeof(TfLitePoolParams)));
      if (p == nullptr) return kTfLiteError;
      p->padding = opt.Byte(0, 0) == 0 ? kTfLitePaddingSame : kTfLitePaddingValid;
      p->stride_width = opt.Int(1, 1);
      p->stride_height = opt.Int(2, 1);
      p->filter_width = opt.Int(3, 1);
      p->filter_height = opt.Int(4, 1);
      p->activation = static_cast<TfLiteFusedActivation>(opt.Byte(5, 0));
      o.node.builtin_data = p;
    }
    if (builtin == BuiltinOperator_SOFTMAX) {  // SoftmaxOptions.beta and the scales the kernel needs
      FixtureSoftmaxParams* p = static_cast<FixtureSoftmaxParams*>(Alloc(sizeof(FixtureSoftmaxParams)));
      if (p == nullptr || ins.size < 1 || outs.size < 1) return kTfLiteError;
      p->beta = op.Sub(4).Float(0, 1.0f);
      p->input_scale = tensors_[ins.Int(0)].params.scale;
      p->output_scale = tensors_[outs.Int(0)].params.scale;
      p->output_zero_point = tensors_[outs.Int(0)].params.zero_point;
      o.node.builtin_data = p;
    }
    if (reg->prepare != nullptr && reg->prepare(&context_, &o.node) != kTfLiteOk) return kTfLiteError;
  }
  inputs_ = IntArray(static_cast<int>(sg.Vector(1).size));
  outputs_ = IntArray(static_cast<int>(sg.Vector(2).size));
  if (inputs_ == nullptr || outputs_ == nullptr) return kTfLiteError;
  for (int j = 0; j < inputs_->size; ++j) inputs_->data[j] = sg.Vector(1).Int(static_cast<uint32_t>(j));
  for (int j = 0; j < outputs_->size; ++j) outputs_->data[j] = sg.Vector(2).Int(static_cast<uint32_t>(j));
  allocated_ = true;
  return kTfLiteOk;
}

TfLiteStatus MicroInterpreter::Invoke() {
  if (!allocated_) return kTfLiteError;
  for (int k = 0; k < num_ops_; ++k) {
    if (ops_[k].registration->invoke(&context_, &ops_[k].node) != kTfLiteOk) {
      MicroPrintf("Node %d failed to invoke", k);
      return kTfLiteError;
    }
  }
  return kTfLiteOk;
}

TfLiteTensor* MicroInterpreter::input(size_t index) {
  return allocated_ && index < inputs_size() ? &tensors_[inputs_->data[index]] : nullptr;
}

TfLiteTensor* MicroInterpreter::output(size_t index) {
  return allocated_ && index < outputs_size() ? &tensors_[outputs_->data[index]] : nullptr;
}

size_t MicroInterpreter::inputs_size() const { return inputs_ ? static_cast<size_t>(inputs_->size) : 0; }

size_t MicroInterpreter::outputs_size() const { return outputs_ ? static_cast<size_t>(outputs_->size) : 0; }

}  // namespace tflite
