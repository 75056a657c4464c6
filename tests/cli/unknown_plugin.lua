local pe = ctx.pe("nosuch")
