"""`specpack bench`: speculative vs autoregressive decoding of a pack on prompt sets, in one run.

    prompts.py  prompt files -> BenchPrompt        timing.py  c and v(k) on the engines
    runner.py   load, time, decode every prompt    peer_hf.py transformers, in a child process
    report.py   numbers, JSON, tables              plot.py    the PNG

Nothing here imports torch or transformers in this process (only peer_hf's child does).
"""
