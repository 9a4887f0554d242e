# Imported as opsloop.collectors (setup.py maps this folder there). Importing it by the folder name, which a
# checkout on sys.path allows, would load a second copy of every module (metrics registered twice).
if __name__ != "opsloop.collectors":
    raise ImportError(f"import opsloop.collectors, not {__name__} (the folder collectors/ is the package opsloop.collectors)")
