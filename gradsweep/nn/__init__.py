"""gradsweep.nn: thin modules over the batch-invariant kernels, and a Qwen3-shaped decoder built from them.

A model is written the ordinary way, ``logp = model(ids, targets, ctx)``; the ``ChainContext`` carries the
step's row identities, the folds (one FP32 main grad per weight) and the attention caches. Importing this
package registers the kernels as ``torch.ops.gradsweep.*`` custom ops. It never imports the harness.
"""

from gradsweep.nn.context import ChainContext
from gradsweep.nn.modules import (
    FAMILIES,
    Attention,
    Embedding,
    Linear,
    LinearLogp,
    QKNorm,
    RMSNorm,
    RoPE,
    SwiGLUMLP,
    WeightRef,
)
from gradsweep.nn.qwen3 import WEIGHTS, Qwen3Decoder, Qwen3Shape, init_weights, new_context, reference_logp

__all__ = [
    "FAMILIES", "WEIGHTS", "Attention", "ChainContext", "Embedding", "Linear", "LinearLogp", "QKNorm", "Qwen3Decoder",
    "Qwen3Shape", "RMSNorm", "RoPE", "SwiGLUMLP", "WeightRef", "init_weights", "new_context", "reference_logp",
]
