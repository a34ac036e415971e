# Sourced by the build scripts: ccache keys that do not depend on where the checkout lies, so a
# fresh clone on a machine that built zero before (CI's clone beside a developer's) compiles only
# what changed. base_dir makes the paths under the checkout relative; hash_dir drops the build
# directory from the key; the sloppiness lets the precompiled-header units be cached at all.
root=$(pwd -P)
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
