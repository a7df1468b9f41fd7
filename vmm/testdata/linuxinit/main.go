// Command linuxinit is the /init of the Linux boot test's initramfs: it
// prints initLine on the console and powers the machine off. Built with
// CGO_ENABLED=0, so it is static.
package main

import (
	"fmt"
	"os"
	"syscall"
)

const initLine = "tern-linux-init: hello"

func main() {
	// The initramfs has an empty /dev; the console node comes with devtmpfs.
	_ = syscall.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	if c, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		fmt.Fprintln(c, initLine)
		c.Close()
	} else {
		fmt.Println(initLine) // the kernel's own console, when it opened one
	}
	syscall.Sync()
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	select {} // init must not exit
}
