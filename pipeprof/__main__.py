import gc
import sys

from .cli import main

code = main()
# What the command opened it has closed (files written whole and renamed, loaders and their workers shut
# down): the interpreter's exit need not walk every object torch, pandas and matplotlib made, a walk that
# delays every command's end (docs/measured.md, "Process exit"). Frozen objects are still freed by reference
# count, only not by collection.
gc.freeze()
sys.exit(code)
