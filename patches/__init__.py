"""SGLang hooks (installed as ``vase_sglang.patches``): one module per SGLang area."""
