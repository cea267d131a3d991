"""``sgl_kernel.utils`` stand-in: no programmatic dependent launch, everything else raises when called."""

from ._stub import module_getattr


def is_arch_support_pdl() -> bool:
    """The triton backend asks this at every launch; PDL needs the real kernels."""
    return False


__getattr__ = module_getattr(__name__)
