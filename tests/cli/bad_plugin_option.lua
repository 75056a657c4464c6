local m = ctx.model{ pe = ctx.pe("rope", { layout = "diagonal" }) }
