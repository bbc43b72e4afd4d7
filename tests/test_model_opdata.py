"""harness.model.opdata: resolver registrations and ESP-NN acceleration (table + per-op fallbacks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tflite.utils
from test_model_builder import int8_broadcast_add_model, int16_add_model

from harness.errors import ModelError, UsageError
from harness.model import opdata
from harness.model.loader import load_model, parse_model_bytes


@pytest.mark.parametrize(
    ("opcode", "method"),
    [
        ("CONV_2D", "AddConv2D"),
        ("DEPTHWISE_CONV_2D", "AddDepthwiseConv2D"),
        ("REDUCE_MAX", "AddReduceMax"),
        ("ADD_N", "AddAddN"),
        ("RESIZE_NEAREST_NEIGHBOR", "AddResizeNearestNeighbor"),
        ("UNIDIRECTIONAL_SEQUENCE_LSTM", "AddUnidirectionalSequenceLSTM"),
        ("BATCH_TO_SPACE_ND", "AddBatchToSpaceNd"),
        ("LOG_SOFTMAX", "AddLogSoftmax"),
        ("SVDF", "AddSvdf"),
    ],
)
def test_resolver_methods(opcode: str, method: str) -> None:
    assert opdata.resolver_method(opcode) == method


def test_custom_and_unknown_ops() -> None:
    assert opdata.resolver_method("CUSTOM", "TFLite_Detection_PostProcess") == "AddDetectionPostprocess"
    with pytest.raises(ModelError, match="LSH_PROJECTION"):
        opdata.resolver_method("LSH_PROJECTION")
    with pytest.raises(ModelError, match="Nope"):
        opdata.resolver_method("CUSTOM", "Nope")


def test_table_is_consistent_with_the_schema() -> None:
    names = set(tflite.utils.BUILTIN_OPCODE2NAME.values())
    table = opdata._table()
    assert set(table["resolver"]) <= names
    assert all(re.fullmatch(r"Add[A-Z][A-Za-z0-9]*", m) for m in table["resolver"].values())
    assert len(table["resolver"]) >= 90
    src = opdata.sources()
    assert "micro_mutable_op_resolver.h" in src["resolver"] and "esp-nn" in src["espnn"]
    for family in table["espnn"].values():
        assert set(family["ops"]) <= set(table["resolver"])


def test_espnn_table_per_issue() -> None:
    generic = {"CONV_2D", "DEPTHWISE_CONV_2D", "SOFTMAX"}
    s3 = generic | {"FULLY_CONNECTED", "ADD", "MUL", "MAX_POOL_2D", "AVERAGE_POOL_2D"}
    for chip in ("esp32", "esp32c3", "esp32c6", "esp32s2", "ESP32-C3"):
        assert set(opdata.espnn_ops(chip)) == generic, chip
        assert opdata.chip_family(chip) == "generic"
    assert set(opdata.espnn_ops("esp32s3")) == s3
    assert set(opdata.espnn_ops("esp32p4")) == s3
    assert opdata.espnn_accelerated("FULLY_CONNECTED", "esp32s3")
    assert not opdata.espnn_accelerated("FULLY_CONNECTED", "esp32")
    assert not opdata.espnn_accelerated("RESHAPE", "esp32s3")
    with pytest.raises(UsageError):
        opdata.chip_family("stm32f4")


def test_op_zoo_fallbacks(models_dir: Path) -> None:
    info = load_model(models_dir / "op_zoo.tflite")
    s3 = {a.index: a for a in opdata.espnn_model_acceleration(info, "esp32s3")}
    generic = {a.index: a for a in opdata.espnn_model_acceleration(info, "esp32")}
    for op in info.ops:
        a = s3[op.index]
        if op.options.get("dilation_h_factor", 1) != 1:
            assert not a.accelerated and "dilation" in a.reason
        if op.opcode in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):  # 13 channels
            assert not a.accelerated and "depth 13" in a.reason
        if op.opcode in ("FULLY_CONNECTED", "ADD", "MUL"):
            assert a.accelerated, op
            assert not generic[op.index].accelerated
        if op.opcode in ("RESHAPE", "PAD", "TANH", "MEAN"):
            assert not a.accelerated and "no ESP-NN kernel" in a.reason
    assert sum(a.accelerated for a in s3.values()) == 10
    assert sum(a.accelerated for a in generic.values()) == 6


def test_classifier_all_listed_ops_accelerated_on_s3(models_dir: Path) -> None:
    info = load_model(models_dir / "cnn_classifier_11.tflite")
    acc = opdata.espnn_model_acceleration(info, "esp32s3")
    assert all(a.accelerated for a in acc)  # every op of this model is an ESP-NN op, channels % 4 == 0
    assert opdata.resolver_methods(info)[0] == "AddConv2D" and len(opdata.resolver_methods(info)) == 8


def test_broadcast_and_int16_fall_back() -> None:
    b = parse_model_bytes(int8_broadcast_add_model())
    (a,) = opdata.espnn_model_acceleration(b, "esp32s3")
    assert not a.accelerated and "broadcast" in a.reason
    i16 = parse_model_bytes(int16_add_model())
    (a,) = opdata.espnn_model_acceleration(i16, "esp32p4")
    assert not a.accelerated and "int16" in a.reason
