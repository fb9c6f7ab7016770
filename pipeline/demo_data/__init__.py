"""Competition folders to run the pipeline on: synthetic speakers (`synthetic`), spoken digits (`fsdd`) and
soundscapes made from either (`soundscapes`). May import every layer below it. Import the submodules directly.
"""
