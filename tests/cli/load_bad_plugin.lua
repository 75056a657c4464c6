ctx.load_plugin(arg[1])
