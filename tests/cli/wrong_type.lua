local m = ctx.model{ n_head = "four" }
