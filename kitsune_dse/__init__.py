"""kitsune-dse: decide how a DL model graph should run on a GPU, and prove it.

Data flow: graph -> hw -> cost -> search -> report -> validate.
"""
__version__ = "0.1.0"
