"""Calibration: GPU microbenchmarks (microbench.py, CuPy) and the fit of a spec's efficiency
parameters to them (fit.py, no GPU)."""
