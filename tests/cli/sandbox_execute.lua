os.execute("true")
print("executed")
