"""The repository's root folder: tests run the top-level scripts from it and read its files by path, from whichever
folder under tests/ they live in."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
