# Imported for its side effects by the fixture generators and benchmarks that use
# transformers 4.51.3 on Debian's torch 1.13 (see scripts/setup-torch-ref.sh).
# Shim: transformers 4.51.3 does an unconditional `import torch.distributed.tensor`
# which does not exist in Debian bookworm's torch 1.13. Nothing on the eager CPU path uses it.
import sys, types, torch, torch.distributed
try:  # a current torch has it (../shared/tools/torch-current); only 1.13 needs the stub
    import torch.distributed.tensor  # noqa: F401
except ImportError:
    m = types.ModuleType("torch.distributed.tensor")
    class DTensor:  # never instantiated
        pass
    m.DTensor = DTensor
    sys.modules["torch.distributed.tensor"] = m
    torch.distributed.tensor = m
# Shim: torch.compiler (torch>=2.1) is referenced as a decorator at import time.
if not hasattr(torch, "compiler"):
    c = types.ModuleType("torch.compiler")
    def disable(fn=None, recursive=True):
        if fn is None:
            return lambda f: f
        return fn
    c.disable = disable
    c.is_compiling = lambda: False
    c.is_dynamo_compiling = lambda: False
    sys.modules["torch.compiler"] = c
    torch.compiler = c
# Shim: newer dtypes referenced at import time in dtype tables (never used for our fp32 model).
class _FakeDtype:
    def __init__(self, name): self.name = name
    def __repr__(self): return f"torch.{self.name}(shim)"
for _n in ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "uint16", "uint32", "uint64"]:
    if not hasattr(torch, _n):
        setattr(torch, _n, _FakeDtype(_n))
