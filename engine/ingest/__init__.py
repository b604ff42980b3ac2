"""Reading recordings into tables: JFR pauses (`engine.ingest.jfr.read_pauses`).

Kept empty on purpose: importing one reader must not import the others' dependencies.
"""
