"""graphs/: sampling and acceptance inside the graphs (docs/contracts.md, "Graphs").

    attach.build_draft_step_graph(plain_onnx, out_onnx, vocab_size)   plain forward graph -> draft_step.onnx
    attach.build_verify_graph(plain_onnx, out_onnx, vocab_size)       plain forward graph -> verify.onnx
    oracle.transform / draw / draft_step / verify                     the numpy reference, bit-exact with both
    heads.draft_head_model / verify_head_model                        a head alone (tests, benchmarks)

Files: oracle.py (the math, numpy), sampling_graph.py (the same math as ONNX nodes), heads.py (the two
heads), attach.py (graph surgery and the weights' move), prune_logits.py (slice the hidden states before
the lm_head to the rows a head reads), onnx_builder.py (a tiny node builder).
"""
