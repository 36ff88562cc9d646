from kitsune_dse.hw.spec import Efficiency, HwSpec, list_specs, load_spec, spec_with_overrides

__all__ = ["HwSpec", "Efficiency", "load_spec", "list_specs", "spec_with_overrides"]
