#!/usr/bin/env bash
# out_of_tree.sh SOURCE_DIR BUILD_DIR WORK_DIR: installs ctxengine to WORK_DIR/prefix, builds
# examples/out_of_tree_pe against it with find_package(ctxengine), then has the installed
# ctxengine list the plugin and train a model with it.
set -eu
src=$1; build=$2; work=$3
rm -rf "$work"; mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$src/examples/out_of_tree_pe" -B "$work/plugin" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/plugin" > "$work/build.log"
"$work/prefix/bin/ctxengine" --plugin "$work/plugin/pe_scaled_alibi.so" --list-plugins | tee "$work/list.txt"
grep -Eq "^pe/scaled_alibi +pe +0\.1\.0 " "$work/list.txt"
grep -Eq "^pe/rope +pe .*prefix/lib/ctxengine/plugins/pe/pe_rope\.so" "$work/list.txt"  # installed plugins found
cat > "$work/use.lua" <<'LUA'
local data = ctx.data.synthetic{ length = 2000, period = 12, vocab_size = 32 }
local m = ctx.model{ vocab_size = 32, d_model = 24, n_layer = 1, n_head = 3, context_length = 16,
                     pe = ctx.pe("scaled_alibi", { scale = 0.5 }) }
local r = ctx.train{ model = m, data = data, steps = 3, batch_size = 2, log_every = 0 }
print("out-of-tree plugin trained", m:config().pe, r.final_loss)
LUA
"$work/prefix/bin/ctxengine" --plugin "$work/plugin/pe_scaled_alibi.so" "$work/use.lua" | tee "$work/use.txt"
grep -q "out-of-tree plugin trained.pe/scaled_alibi" "$work/use.txt"
echo ok
