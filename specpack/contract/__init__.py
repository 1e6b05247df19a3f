"""The pack contract: the manifest's schema, the integrity check, engine records and verified reads.

Both the exporter (which writes packs) and the runtime (which loads them) import this package; it imports
neither (docs/architecture.md, "Layers, enforced")."""
