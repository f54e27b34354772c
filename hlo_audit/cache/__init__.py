"""The results cache: a cell served from it is what lowering it now would give, or it is lowered again.

A cell's lowering is looked up in two steps, as ccache's direct mode or a build system's depfile does:

* its **primary key**: what is known before lowering, without importing the target (the judging process never
  does: ``hlo_audit.worker``): the cell (every axis, overrides, batch, seq, the target's spec), the versions of
  jax/jaxlib/flax/maxtext/TE, the cell's compiler (libtpu for a TPU topology), every ``XLA_*``/``JAX_*``/``LIBTPU_*``
  variable, the Python, hlo-audit's lowering side (every module of the layers up to ``targets``, by
  ``hlo_audit.layers``: no list) and the recorder's code (this package and the worker). It names a **manifest**;
* the manifest's **variants**: what each earlier lowering of the cell read, recorded in the cell's own process
  (forked from the one that imported the target, so what another cell loaded or memoized is never this one's
  unrecorded input) by one mechanism, PEP 578's audit hooks plus what they do not raise (``cache.used``):
  the Python modules it used, and of each module's file what ran (``cache.code``: the module's own statements and
  each code object executed, so an edit to code no cell ran serves them); the files it opened for reading (not a
  module's source loaded, nor one shown in a warning); the paths it asked about (``os.stat``, ``os.path.exists``,
  ``os.access``: absence is a read) and the folders it listed; the modules an import looked for and did not find,
  with where it looked; and what cannot be keyed, which makes the lowering **unservable** (a subprocess, a shell, a
  fork, a socket, a file it read and wrote): never served, lowered every run, and said so. Files of an installed
  distribution, and any distribution's metadata (``*.dist-info``: ``pip install -e`` rewrites its README and pins
  at every commit), count by the distribution's name and version (the target's ``code_under_test``, MaxText, by
  content wherever it is installed), stdlib by the Python's version, every other file (the user's project, an
  editable install, a folder on PYTHONPATH) by SHA-256 and the stamp a ``stat`` gives (size, mtime, ctime, inode:
  ``reads.stamp``); a file whose times or mode the lowering set itself (``os.utime``) is an input all the same,
  one it made (a dump XLA wrote and it read back) is its output. The project's files are named relative to the
  project (the repository's top level, else the config's folder: ``reads.portable``): a copy of it, a second
  worktree, a workspace restored elsewhere or another project sharing the cache_dir checks its own files, never the
  ones a recording was made from. The environment variables it read (``os.environ`` and ``os.environb``) are
  recorded with their values (one it found unset and then set itself, as MaxText's import does DECOUPLE_GCLOUD,
  holds unset or at the value it set). A variant is reused only if all of it still holds: environment and versions
  first, then the paths asked about, then a ``stat`` per file, a hash wherever the stamp differs (a fresh checkout,
  a restored file: then the stamps are refreshed in the manifest), and for a module whose hash differs, what of it
  ran; where that only moved (a helper added above the function a lowering ran), the cell is served with the
  lowering's lines moved as its code did (``cache.moved``), its result analysed again. Size and mtime alone would
  serve a file restored with its old mtime (``cp -p``, ``rsync -a``, a cache-restore step) or edited to the same
  size and ``touch``-ed back; its ctime is new. Several variants per cell, so switching
  a variable back and forth is a hit both ways. The first reason a cell's variants did not hold is the result's
  ``relowered_because``.

Each variant's **entry** (``<entry>.hlo.txt``, ``.lowering.json``, ``.<analysis>.result.json``,
``.<analysis>.normalized.txt``; ``<analysis>`` is hlo-audit's own source) carries a header: what kind of entry it
is, the entry key and cell it was made for, the SHA-256 of its content, and this user's **mark**: an HMAC of the
header under a key made once per user outside every working tree (``$XDG_CACHE_HOME/hlo-audit/cache-key``, else
``~/.cache/hlo-audit/cache-key``, mode 0600; ``store.key_path``). An entry without a valid mark (committed with a
pull request, copied from another machine, another user's in a shared folder) is never taken on its word, whatever
its checksums say: the run says so in one line and lowers its cell again. Anything that does not verify on read
(a changed digit, a truncated text, two cells' files swapped or copied over each other, JSON of another shape) is a
miss, said in one line on stderr, and the cell is computed again: the cache is a miss or right, never wrong. A
manifest is written last, so it only ever names whole entries; every write goes to a temporary file in the same
folder and is renamed into place, so concurrent runs (or one killed midway) never leave a torn entry.

What it does not see: edits made in place inside an installed distribution other than the code under test (pip
never makes one), files read other than through Python (C code) or through a descriptor opened before the lowering,
a new module that would shadow a recorded one (a ``pkg/model/`` folder beside ``pkg/model.py``), and environment
read as a whole (iterating ``os.environ``, as wsgiref's and tqdm's imports do: not a dependency on every variable)
or read in C (hence the prefixes in the primary key). ``--refresh`` lowers again and rewrites.

JSON and text only, never pickle.
"""

from __future__ import annotations

from hlo_audit.cache.key import (
                                 LAYOUT_VERSION,
                                 analysis_fingerprint,
                                 lowering_fingerprint,
                                 lowering_key,
                                 lowering_sources,
                                 package_versions,
                                 source_fingerprint,
)
from hlo_audit.cache.reads import importing_target, reads_after, recording_environment, warm
from hlo_audit.cache.store import LOG_VARIABLE, Cache, CacheError, RecordedInputs, entry_files

__all__ = ["LAYOUT_VERSION", "LOG_VARIABLE", "Cache", "CacheError", "RecordedInputs", "analysis_fingerprint",
           "entry_files", "importing_target",
           "lowering_fingerprint", "lowering_key", "lowering_sources", "package_versions", "reads_after",
           "recording_environment", "source_fingerprint", "warm"]
