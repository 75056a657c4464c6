-- Shared settings of the default recipes (required by pretrain_base.lua and chunk_025.lua).
-- Scale: models small enough that the whole main job (two base models, extension, evaluation)
-- runs in minutes on 2 CPU cores with mpirun -np 2.
local M = {}

M.Lt = 128            -- training context of the base models (tokens)
M.Le = 4 * M.Lt       -- extended context (the paper's 4 Lt)
M.batch_size = 16     -- rows per rank per step

-- The default corpus: generated long documents (docs/CORPORA.md) whose facts are recalled after
-- their latest mention at distances log-uniform over [8, 1024] bytes (about 2 Lt; at least one
-- sentence later), and a tenth of them over [1024, 4096] bytes (up to 8 Lt): dependencies at
-- every distance, most of them inside Lt, so the base models learn to retrieve inside Lt and the
-- extension has to carry that skill to Lt .. Le. Tokens: a byte-level BPE of 1024 trained on the
-- train split (about 3.8 bytes a token), so a window of Lt = 128 tokens holds several fact-recall
-- pairs. A quarter of the documents are held out, for enough far recalls to measure.
M.corpus = {
  dir = "data/generated/default", docs = 800, min_len = 2000, max_len = 8000, seed = 1,
  val_fraction = 0.25, facts = 4, min_distance = 8, max_distance = 1024, far_fraction = 0.1,
  far_distance = 4096, bpe = 1024,
}

-- The two base models of the paper's development setting, at our scale.
M.models = {
  rope = { style = "neox", pe = { "rope", { rotary_pct = 0.25 } } },        -- Pythia-like
  learned = { style = "gpt2", pe = { "learned", { init_std = 0.02 } } },    -- GPT-2-like
  -- Llama-like (llama_chunk_025.lua): RMSNorm, SwiGLU, RoPE on whole heads, 4 query heads
  -- sharing 2 key/value heads, untied head; the MLP at 8/3 d_model (Llama's ratio) keeps its
  -- parameter count near the others'. size: keys over M.size.
  llama = { style = "llama", pe = { "rope", {} }, size = { n_head = 4, n_kv_head = 2 },
            ffn_ratio = 8 / 3 },
}
M.size = { d_model = 64, n_layer = 4, n_head = 2 }  -- vocab_size: the corpus's

M.extend_optimizer = { lr = 3e-3, min_lr = 3e-4 }  -- the chunk training (chunk_experiment.lua)
M.pretrain = { steps = 1500, optimizer = { lr = 3e-3, warmup_steps = 30, min_lr = 3e-4, weight_decay = 0.1 } }
M.eval_windows = 0    -- held-out windows per evaluation length (0: all)
M.runs = "runs"       -- base models live in <runs>/base_<pe>/

-- "quick": the same pipeline shrunk to seconds (ctest runs the recipes this way).
function M.quick(runs)
  M.runs = runs
  M.Lt, M.Le, M.batch_size = 32, 128, 4
  M.corpus = { dir = runs .. "/corpus", docs = 40, min_len = 1000, max_len = 2000, seed = 1,
               val_fraction = 0.2, facts = 4, min_distance = 8, max_distance = 256, far_fraction = 0.1,
               far_distance = 1024, bpe = 512 }
  M.size = { d_model = 32, n_layer = 2, n_head = 2 }
  M.models.rope.pe = { "rope", { rotary_pct = 0.5 } }
  M.pretrain.steps = 30
  M.eval_windows = 6
end

function M.base_dir(pe) return M.runs .. "/base_" .. pe end

-- Builds a fresh base model for one of M.models, with the corpus's vocabulary.
function M.new_model(pe, corpus)
  local spec = assert(M.models[pe], "unknown base model " .. tostring(pe))
  local t = { style = spec.style, context_length = M.Lt, seed = 1, pe = ctx.pe(spec.pe[1], spec.pe[2]),
              vocab_size = corpus.train:vocab_size() }
  for k, v in pairs(M.size) do t[k] = v end
  for k, v in pairs(spec.size or {}) do t[k] = v end
  if spec.ffn_ratio then t.ffn_hidden = math.floor(spec.ffn_ratio * t.d_model / 8 + 0.5) * 8 end
  return ctx.model(t)
end

-- The base model for `pe`: the newest checkpoint in its run directory, or trained now.
function M.base_model(pe, corpus)
  local dir = M.base_dir(pe)
  local path = ctx.latest_checkpoint(dir)
  if path then
    ctx.log("reusing the base model " .. path)
    return ctx.load(path)
  end
  ctx.log(string.format("training the %s base model at Lt = %d (%d steps)", pe, M.Lt, M.pretrain.steps))
  local model = M.new_model(pe, corpus)
  local rows = ctx.data.rows{ docs = corpus.train, window = M.Lt, batch_size = M.batch_size, seed = 11 }
  ctx.train{ model = model, data = rows, steps = M.pretrain.steps, optimizer = M.pretrain.optimizer,
             log_every = 100, out_dir = dir }
  ctx.save_checkpoint(dir, { model = model, data = rows, metadata = { stage = "base" } })
  return model
end

return M
