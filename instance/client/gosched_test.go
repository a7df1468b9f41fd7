package client_test

import "runtime"

// runtimeGosched yields between looks at /proc in the leak check.
func runtimeGosched() { runtime.Gosched() }
