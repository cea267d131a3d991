"""Only here to ship ``vase_sglang_cpu_mode.pth`` at the top of site-packages.

The .pth runs at interpreter start-up in every process (SGLang's scheduler and
detokenizer children too, which import sgl_kernel before any plugin is loaded) and does
nothing unless ``SGLANG_USE_CPU_ENGINE=1``. Everything else is in pyproject.toml.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "vase_sglang_cpu_mode.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
