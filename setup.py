"""Only here to ship two .pth files at the top of site-packages; the rest is in pyproject.toml.

Both run at interpreter start-up in every process, before any SGLang plugin can load:

* ``vase_sglang_cpu_mode.pth``: the sgl_kernel stand-in (SGLang's scheduler and
  detokenizer children import sgl_kernel first); nothing unless ``SGLANG_USE_CPU_ENGINE=1``.
* ``vase_sglang_frontend.pth``: ``sgl.Runtime(kv_policy=...)`` (see patches/frontend.py);
  it only adds a one-shot import hook and imports nothing heavy.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTHS = ("vase_sglang_cpu_mode.pth", "vase_sglang_frontend.pth")


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        for pth in PTHS:
            self.copy_file(pth, os.path.join(self.build_lib, pth))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, pth) for pth in PTHS]


setup(cmdclass={"build_py": BuildPyWithPth})
