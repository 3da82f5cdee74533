"""The C extension of sapo-native (pyproject.toml holds the rest): setuptools builds it with the
machine's C compiler, as pip already does for reasoning-gym's pycosat."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("sapo_native._text", ["sapo_native/_text.c"], extra_compile_args=["-O3"])])
