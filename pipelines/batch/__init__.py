"""A batch of dropped files, step by step, plain Python (pipelines/ingest.py is the entry):

1. find what is new: the sensors, from the store's notifications and the ledger
   (pipelines/intake/), each file a `Found`;
2. snapshot: each file's GET and its immutable copy (`steps.snapshot` -> `Snapshotted`);
3. parse: the source that recognizes its bytes (`steps.parse` -> `Parsed`);
4. normalize: its parser version judged, and its record set built, or found written before
   (`steps.normalize` -> `Normalized` or `Reused`);
5. write the batch's record objects (`uploads.py`), then its sets file (`sets_file.py`): every
   file's summary and read (`steps.write` -> `Written`);
6. commit each file's outcome to the ledger, one append for the batch (`steps.commit`), then
   publish the index once.

Each step is a function from one type to the next, so the order is the type checker's to keep.
A file that fails at a step becomes a `Failed` of its own (its ledger row) and leaves the batch;
its neighbours go on.

A file whose rows wait for another (a FlashInfer trace for its definition, `awaiting.py`) is
written as it is; when a batch brings what it waits for, the ledger marks it due again and a
later batch reads it like any other.
"""
