"""Calibration: the data a calibrated quantization sees (sets.py: sampling from a prompt file, its hash) and the
calibrated Q/DQ stage over it (qdq.py: nvidia-modelopt's ONNX PTQ, its cache)."""
