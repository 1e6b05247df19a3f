"""calibration/: INT8 / FP8 quantization of the pack's graphs with a calibration record (not built yet)."""
