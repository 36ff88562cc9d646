"""Graph IR, model zoo, YAML and ONNX front-ends."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kitsune_dse import resources
from kitsune_dse.errors import KitsuneError, closest
from kitsune_dse.graph.ir import (DTYPE_BYTES, DepPattern, GemmDims, Graph, Op, OpClass, OpInfo,
                                  Tensor)

__all__ = ["Graph", "Op", "Tensor", "OpInfo", "OpClass", "DepPattern", "GemmDims", "DTYPE_BYTES",
           "load_model", "list_models"]


def list_models() -> dict[str, Path]:
    return resources.models()


def load_model(ref: str | Path, overrides: Mapping[str, int] | None = None) -> Graph:
    """A model by zoo name (e.g. 'gpt3-mlp'), YAML path or ONNX path; `overrides` set sizes."""
    ref = str(ref)
    p = Path(ref)
    if p.suffix == ".onnx":
        from kitsune_dse.graph.onnx_import import load_onnx_model
        if not p.exists():
            raise KitsuneError("ONNX file not found", where=ref)
        return load_onnx_model(p, overrides or {})
    from kitsune_dse.graph.yaml_model import load_yaml_model
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise KitsuneError("model file not found", where=ref)
        return load_yaml_model(p, overrides)
    zoo = list_models()
    if ref not in zoo:
        raise KitsuneError(f"unknown model {ref!r}{closest(ref, zoo)}; `kitsune-dse models list` "
                           f"shows the zoo, or pass a .yaml or .onnx path")
    return load_yaml_model(zoo[ref], overrides)
