# Imported as opsloop.streams (setup.py maps this folder there). Importing it by the folder name, which a
# checkout on sys.path allows, would load a second copy of every module (metrics registered twice).
if __name__ != "opsloop.streams":
    raise ImportError(f"import opsloop.streams, not {__name__} (the folder streams/ is the package opsloop.streams)")
