local pe = ctx.pe("rope", { bsae = 500 })
