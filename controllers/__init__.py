# Imported as opsloop.controllers (setup.py maps this folder there). Importing it by the folder name, which a
# checkout on sys.path allows, would load a second copy of every module (metrics registered twice).
if __name__ != "opsloop.controllers":
    raise ImportError(f"import opsloop.controllers, not {__name__} (the folder controllers/ is the package opsloop.controllers)")
