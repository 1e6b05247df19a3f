"""graphs/: sampling and acceptance inside the graphs (docs/contracts.md, "Graphs").

    attach.build_draft_step_graph(plain_onnx, out_onnx, vocab_size)   plain forward graph -> draft_step.onnx
    attach.build_verify_graph(plain_onnx, out_onnx, vocab_size)       plain forward graph -> verify.onnx
    oracle.transform / draw / draft_step / verify                     the numpy reference, bit-exact with both
    heads.draft_head_model / verify_head_model                        a head alone (tests, benchmarks)
    tree_oracle.verify_tree / ancestors / depths                      acceptance over a token tree, numpy (docs/trees.md)
    tree_head.tree_verify_head_model / tree_mask_model                the tree head and the tree masks alone, bit-exact with it

Files: oracle.py (the math, numpy), sampling_graph.py (the same math as ONNX nodes), heads.py (the two
heads), tree_oracle.py and tree_head.py (the same for token trees), attach.py (graph surgery and the
weights' move), prune_logits.py (slice the hidden states before the lm_head to the rows a head reads),
onnx_builder.py (a tiny node builder).
"""
