package kvmhost

import (
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// nicWait bounds how long init waits for the network card's interface to
// appear after its driver loaded (the probe may finish asynchronously).
const nicWait = 10 * time.Second

// networkUp gives eth0 GuestAddr/24 and brings it up. The e1000 module
// was loaded with the others.
func networkUp() error {
	deadline := time.Now().Add(nicWait)
	for {
		if _, err := os.Stat("/sys/class/net/" + guestNIC); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bringing up %s: no such interface after %v (is the e1000 driver in the initramfs?)", guestNIC, nicWait)
		}
		time.Sleep(10 * time.Millisecond) // init polls sysfs: there is no event to wait on without netlink
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bringing up %s: %w", guestNIC, err)
	}
	defer unix.Close(fd)
	set := func(req uint, what string, addr net.IP) error {
		ifr, err := unix.NewIfreq(guestNIC)
		if err != nil {
			return err
		}
		if err := ifr.SetInet4Addr(addr.To4()); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, req, ifr); err != nil {
			return fmt.Errorf("bringing up %s: setting %s: %w", guestNIC, what, err)
		}
		return nil
	}
	if err := set(unix.SIOCSIFADDR, "address", net.ParseIP(GuestAddr)); err != nil {
		return err
	}
	mask := net.IP(net.CIDRMask(guestPrefixLen, 32))
	if err := set(unix.SIOCSIFNETMASK, "netmask", mask); err != nil {
		return err
	}
	ifr, err := unix.NewIfreq(guestNIC)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing up %s: reading flags: %w", guestNIC, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing up %s: %w", guestNIC, err)
	}
	return nil
}
