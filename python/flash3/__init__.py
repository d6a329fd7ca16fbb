"""flash3 for PyTorch.

A placeholder so that the wheel has its package: the Python package's own
modules (the ctypes bindings of libflash3_c, the torch.library ops) replace
this file.
"""
