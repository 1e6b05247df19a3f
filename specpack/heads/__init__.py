"""Draft heads (EAGLE-style) for a target model: the torch module, its file format and the target's hash.

    model.py         HeadConfig + DraftHead: fc over the target's tapped features, one decoder layer, a norm and the
                     target's frozen lm_head rows over a frequency-ranked vocabulary subset (docs/heads.md)
    head_file.py     HEAD/: head.safetensors (trained weights + subset ids) + head.json (config, recipe, losses)
    target_hash.py   sha256 of the target's weights, so a head is never used with another target

torch is imported inside functions (and by model.py, which only torch users import).
"""
