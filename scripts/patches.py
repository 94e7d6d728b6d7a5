#!/usr/bin/env python3
"""Apply, check and measure pipeshard's llama.cpp patch series.

patches/series lists the patches in the order they apply to the pristine
release (the sdist that build.rs fetches into vendor/), one path under
patches/ a line; a patch's directory is its series (its concern). A line
ending in `standalone` marks a patch that must also apply alone to the
pristine release (the upstream fixes). build.rs reads the same file.

  scripts/patches.py list              the patches in order
  scripts/patches.py apply DIR [SERIES]
                                       the pristine release with every patch applied (up to
                                       the end of SERIES), in DIR
  scripts/patches.py apply DIR --patches PATCHES
                                       the same with another patches/ directory (an old
                                       flat one applies in file-name order)
  scripts/patches.py check             each stand-alone patch applies alone to the pristine
                                       release, the whole list applies in order without
                                       fuzz, then the stats below
  scripts/patches.py stats [--patches DIR]
                                       upstream functions edited by more than one series,
                                       and the lines the series add to and remove from
                                       ggml-backend.cpp; DIR without a series file (the old
                                       flat layout) counts each patch as a series of its own
  scripts/patches.py add SERIES FILE   slot a new patch into a series (patches/README.md
                                       says how)

The pristine release: $PIPESHARD_LLAMA_SDIST, else vendor/'s sdist (the
version and SHA-256 are build.rs's). Needs git and GNU patch.
"""
import collections
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCHES = os.path.join(ROOT, 'patches')
BACKEND = 'ggml/src/ggml-backend.cpp'


class Failure(Exception):
    pass


def build_rs_const(name):
    text = open(os.path.join(ROOT, 'build.rs')).read()
    m = re.search(rf'const {name}: &str = "([^"]+)";', text)
    if not m:
        raise Failure(f'build.rs defines no {name}')
    return m.group(1)


def sdist():
    name = build_rs_const('LLAMA_SDIST').replace('-', '_')
    version = build_rs_const('LLAMA_SDIST_VERSION')
    want = build_rs_const('LLAMA_SDIST_SHA256')
    candidates = [os.environ.get('PIPESHARD_LLAMA_SDIST'),
                  os.path.join(ROOT, 'vendor', f'{name}-{version}.tar.gz')]
    for c in filter(None, candidates):
        if os.path.isfile(c) and hashlib.sha256(open(c, 'rb').read()).hexdigest() == want:
            return c, f'{name}-{version}/llama.cpp/'
    raise Failure('no pristine llama.cpp sdist: build once (./dev cargo build --release) '
                  'to fetch it into vendor/, or set PIPESHARD_LLAMA_SDIST')


def extract(dest):
    path, prefix = sdist()
    with tarfile.open(path) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and len(m.name) > len(prefix):
                m.name = m.name[len(prefix):]
                members.append(m)
        if hasattr(tarfile, 'data_filter'):
            tar.extractall(dest, members=members, filter='data')
        else:
            tar.extractall(dest, members=members)


def read_series(patches_dir=PATCHES):
    """[(path under patches_dir, series, standalone)] in applying order."""
    if not os.path.isdir(patches_dir):
        raise Failure(f'no directory {patches_dir}')
    listing = os.path.join(patches_dir, 'series')
    if not os.path.exists(listing):
        # The old flat layout: every patch a series of its own.
        names = sorted(f for f in os.listdir(patches_dir) if f.endswith('.patch'))
        return [(f, f, False) for f in names]
    out = []
    for n, line in enumerate(open(listing), 1):
        words = line.split('#', 1)[0].split()
        if not words:
            continue
        if len(words) > 2 or (len(words) == 2 and words[1] != 'standalone'):
            raise Failure(f'{listing}:{n}: expected "PATH [standalone]"')
        if not os.path.isfile(os.path.join(patches_dir, words[0])):
            raise Failure(f'{listing}:{n}: no file patches/{words[0]}')
        out.append((words[0], os.path.dirname(words[0]) or words[0], len(words) == 2))
    return out


def check_opening(patch_file):
    """A patch opens with what and why: text before its first diff."""
    for line in open(patch_file, encoding='utf-8', errors='replace'):
        if line.startswith(('diff --git', '--- ', '+++ ', '@@')):
            raise Failure(f'{os.path.relpath(patch_file, ROOT)} does not open with what and why')
        if line.strip():
            return


def patch(tree, patch_file, dry_run=False):
    args = ['patch', '-p1', '--forward', '--batch', '--no-backup-if-mismatch', '-i', patch_file]
    if dry_run:
        args.append('--dry-run')
    r = subprocess.run(args, cwd=tree, capture_output=True, text=True)
    if r.returncode != 0:
        raise Failure(f'{os.path.relpath(patch_file, ROOT)} does not apply:\n{r.stdout}{r.stderr}')
    if 'fuzz' in r.stdout:
        raise Failure(f'{os.path.relpath(patch_file, ROOT)} applies only with fuzz:\n{r.stdout}')


def git(tree, *args):
    r = subprocess.run(['git', '-c', 'safe.directory=*', *args], cwd=tree, capture_output=True)
    if r.returncode != 0:
        raise Failure(f'git {" ".join(args)}: {r.stderr.decode()}')
    return r.stdout


def commit(tree, message):
    git(tree, 'add', '-A', '-f', '.')
    git(tree, '-c', 'user.name=patches.py', '-c', 'user.email=patches.py@localhost',
        'commit', '-q', '--allow-empty', '--no-verify', '-m', message)
    return git(tree, 'rev-parse', 'HEAD').decode().strip()


def cmd_list():
    for path, _, standalone in read_series():
        print(f'patches/{path}' + ('  (standalone)' if standalone else ''))


def cmd_apply(dest, upto=None, patches_dir=PATCHES):
    series = read_series(patches_dir)
    if upto is not None:
        last = max((i for i, (_, s, _) in enumerate(series) if s == upto), default=None)
        if last is None:
            raise Failure(f'no series {upto} in patches/series')
        series = series[:last + 1]
    if os.path.exists(dest):
        raise Failure(f'{dest} exists')
    extract(dest)
    for path, _, _ in series:
        patch(dest, os.path.join(patches_dir, path))


def cmd_check():
    series = read_series()
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, 'llama.cpp')
        extract(tree)
        alone = [p for p, _, s in series if s]
        for path in alone:
            patch(tree, os.path.join(PATCHES, path), dry_run=True)
        print(f'{len(alone)} stand-alone patches apply alone to the pristine release')
        for path, _, _ in series:
            check_opening(os.path.join(PATCHES, path))
            patch(tree, os.path.join(PATCHES, path))
        print(f'{len(series)} patches in {len({s for _, s, _ in series})} series apply in order')
    cmd_stats(PATCHES)


HUNK = re.compile(rb'^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$')


def edits(tree, a, b):
    """The -U0 blocks of a..b as (path, header, removed, added lines)."""
    out = git(tree, 'diff', '-U0', '--no-renames', '--no-color', '--no-ext-diff', a, b)
    path, blocks, left = None, [], 0  # left: lines of the current block still to read
    for line in out.split(b'\n'):
        if left:
            blocks[-1][2 if line.startswith(b'-') else 3].append(line[1:])
            left -= 1
        elif line.startswith(b'+++ '):
            path = line[6:].decode() if line.startswith(b'+++ b/') else None
        elif line.startswith(b'@@') and path:
            m = HUNK.match(line)
            left = int(m.group(2) or 1) + int(m.group(4) or 1)
            blocks.append([path, m.group(5).strip(), [], []])
    return blocks


def upstream_function(block, pristine_lines):
    """The upstream function a block edits, or None: git's hunk header (the
    last line above the block that starts in column 0) where it is a function
    of the pristine file, unless the block only adds code at file scope."""
    path, header, removed, added = block
    if b'(' not in header or header.startswith((b'extern', b'namespace', b'#')):
        return None
    first = next((l for l in added if l.strip()), b'')
    if not removed and first[:1] not in (b' ', b'\t', b'}', b''):
        return None
    # git shortens a long header; the function is the pristine line it starts.
    line = next((l for l in pristine_lines.get(path, ()) if l.startswith(header)), None)
    return line.decode(errors='replace') if line else None


def cmd_stats(patches_dir):
    series = read_series(patches_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, 'llama.cpp')
        extract(tree)
        git(tree, 'init', '-q')
        git(tree, 'config', 'core.autocrlf', 'false')
        # Hunk headers name C/C++ functions the way `git diff` shows them.
        with open(os.path.join(tree, '.git', 'info', 'attributes'), 'w') as f:
            f.write('*.c diff=cpp\n*.cpp diff=cpp\n*.h diff=cpp\n*.cu diff=cpp\n')
        base = commit(tree, 'pristine')
        commits = []
        for i, (path, name, _) in enumerate(series):
            patch(tree, os.path.join(patches_dir, path))
            if i + 1 == len(series) or series[i + 1][1] != name:
                commits.append((name, commit(tree, name)))
        pristine_lines = {}
        editors = collections.defaultdict(set)
        backend_lines = 0
        prev = base
        for name, rev in commits:
            for block in edits(tree, prev, rev):
                path = block[0]
                if path not in pristine_lines:
                    try:
                        text = git(tree, 'show', f'{base}:{path}')
                    except Failure:
                        text = b''
                    pristine_lines[path] = [l for l in text.split(b'\n') if l[:1].isalpha()]
                fn = upstream_function(block, pristine_lines)
                if fn:
                    editors[(path, fn)].add(name)
                if path == BACKEND:
                    backend_lines += len(block[2]) + len(block[3])
            prev = rev
    shared = sorted((k, v) for k, v in editors.items() if len(v) > 1)
    print(f'{len(commits)} series; {len(editors)} upstream functions edited, '
          f'{len(shared)} of them by more than one series')
    for (path, fn), names in shared:
        print(f'  {path}: {fn}  <- {", ".join(sorted(names))}')
    in_backend = sum(1 for path, _ in editors if path == BACKEND)
    print(f'{BACKEND}: {backend_lines} lines added and removed by in-place edits, '
          f'{in_backend} upstream functions edited')


def touched_files(patch_file):
    """The files a patch changes, as `patch -p1` names them."""
    names = (line[4:].split('\t')[0].strip()
             for line in open(patch_file, encoding='utf-8', errors='replace')
             if line.startswith('+++ ') and not line.startswith('+++ /dev/null'))
    return {n.split('/', 1)[1] for n in names if '/' in n}


def cmd_add(name, new_patch):
    """Put FILE into patches/SERIES/ and list it after the series' last patch
    (stand-alone where the series' patches are), then check."""
    series = read_series()
    if not os.path.isfile(new_patch):
        raise Failure(f'no file {new_patch}')
    mine = [i for i, (_, s, _) in enumerate(series) if s == name]
    if not mine:
        raise Failure(f'no series {name} in patches/series (add a line for a new one)')
    dest = f'{name}/{os.path.basename(new_patch)}'
    if os.path.exists(os.path.join(PATCHES, dest)):
        raise Failure(f'patches/{dest} exists')
    standalone = all(series[i][2] for i in mine)
    files = touched_files(new_patch)
    later = collections.defaultdict(set)
    for path, other, _ in series[mine[-1] + 1:]:
        later[other] |= files & touched_files(os.path.join(PATCHES, path))
    for other, shared in later.items():
        for f in sorted(shared):
            print(f'note: the later series {other} also patches {f}; if the check fails, add the '
                  f'patch to {other} or make it against the tree up to {name}')
    os.makedirs(os.path.join(PATCHES, name), exist_ok=True)
    shutil.copyfile(new_patch, os.path.join(PATCHES, dest))
    listing = os.path.join(PATCHES, 'series')
    lines = open(listing).read().splitlines(keepends=True)
    after = series[mine[-1]][0]
    at = max(i for i, l in enumerate(lines) if l.split('#', 1)[0].split()[:1] == [after])
    lines.insert(at + 1, dest + (' standalone' if standalone else '') + '\n')
    open(listing, 'w').write(''.join(lines))
    print(f'patches/{dest} listed after patches/{after}; checking')
    cmd_check()


COMMANDS = [
    (('list',), cmd_list),
    (('apply', 'DIR'), cmd_apply),
    (('apply', 'DIR', 'SERIES'), cmd_apply),
    (('apply', 'DIR', '--patches', 'PATCHES'), lambda d, p: cmd_apply(d, patches_dir=p)),
    (('check',), cmd_check),
    (('stats',), lambda: cmd_stats(PATCHES)),
    (('stats', '--patches', 'DIR'), cmd_stats),
    (('add', 'SERIES', 'FILE'), cmd_add),
]


def parse(argv):
    """The command and its arguments (the words in capitals), or None."""
    for words, run in COMMANDS:
        if len(words) == len(argv) and all(w == a or w.isupper() for w, a in zip(words, argv)):
            return run, [a for w, a in zip(words, argv) if w.isupper()]
    return None


def main(argv):
    if argv[:1] in (['-h'], ['--help'], ['help']):
        print(__doc__.strip())
        return 0
    parsed = parse(argv)
    if parsed is None:
        print(f'patches.py: bad command line: {" ".join(argv) or "(empty)"}\n\n{__doc__.strip()}',
              file=sys.stderr)
        return 1
    run, args = parsed
    try:
        run(*args)
    except Failure as e:
        print(f'patches.py: {e}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
