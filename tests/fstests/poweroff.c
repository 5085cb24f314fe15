/* Power the fstests guest off (the Debian minbase root has no init system of its own). */
#include <sys/reboot.h>
#include <unistd.h>

int main(void)
{
	sync();
	reboot(RB_POWER_OFF);
	return 1;
}
