"""The compiled kernels (dqtool.native._codes), built by `pip install` with the rest of
the package; everything else is in pyproject.toml. Optional: where it cannot be built (no
C compiler), the install goes on without it and dqtool runs on NumPy, with the same bytes."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "dqtool.native._codes",
    sources=["dqtool/native/module.c", "dqtool/native/transpose.c",
             "dqtool/native/lookup.c"],
    depends=["dqtool/native/kernels.h"],
    extra_compile_args=["-O3", "-fno-strict-aliasing"],
    optional=True,
)])
