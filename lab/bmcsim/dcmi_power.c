/*
 * dcmi_power.c - an ipmi_sim extension that answers DCMI "Get Power Reading".
 *
 * OpenIPMI's simulator knows no DCMI. This module registers a handler for the
 * DCMI group extension (netfn 0x2C, group id 0xDC) and answers command 0x02
 * (Get Power Reading) from a small text file, so a test changes the wattage
 * of a simulated BMC by writing that file.
 *
 * Load it from the lan.conf of one simulated BMC:
 *
 *     loadlib "/path/dcmi_power.so" "watts_file=/tmp/bmc1/watts"
 *
 * File contents (read on every request):
 *     "155"              instantaneous = min = max = average = 155 W
 *     "155 140 260 150"  instantaneous, minimum, maximum, average
 *     "na" or empty      power measurement not active (reading state deactivated)
 *     "short"            a truncated reply (to exercise clients on bad answers)
 *     "error"            completion code 0xD5 (not supported in present state)
 * A missing file reads as "na".
 */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <OpenIPMI/serv.h>
#include <OpenIPMI/mcserv.h>

#define DCMI_GROUP_ID 0xdc
#define DCMI_CMD_GET_CAPABILITIES 0x01
#define DCMI_CMD_GET_POWER_READING 0x02
#define DCMI_STATE_ACTIVE 0x40
#define SAMPLE_PERIOD_MS 1000u

#define CC_OK 0x00
#define CC_INVALID_CMD 0xc1
#define CC_REQ_LEN_INVALID 0xc7
#define CC_NOT_IN_STATE 0xd5

static char watts_file[512];
static sys_data_t *sim;

enum reading_kind { READING_OK, READING_NA, READING_SHORT, READING_ERROR };

struct reading {
    enum reading_kind kind;
    unsigned int cur, min, max, avg;
};

static unsigned int clamp16(long v)
{
    if (v < 0)
        return 0;
    if (v > 0xffff)
        return 0xffff;
    return (unsigned int) v;
}

static struct reading read_watts(void)
{
    struct reading r = { READING_NA, 0, 0, 0, 0 };
    char buf[128];
    FILE *f = fopen(watts_file, "r");
    size_t n;
    long v[4];
    int got;

    if (!f)
        return r;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';

    if (strncmp(buf, "short", 5) == 0) {
        r.kind = READING_SHORT;
        return r;
    }
    if (strncmp(buf, "error", 5) == 0) {
        r.kind = READING_ERROR;
        return r;
    }
    got = sscanf(buf, "%ld %ld %ld %ld", &v[0], &v[1], &v[2], &v[3]);
    if (got < 1)
        return r;                       /* "na", empty or unreadable */
    r.kind = READING_OK;
    r.cur = clamp16(v[0]);
    r.min = got >= 2 ? clamp16(v[1]) : r.cur;
    r.max = got >= 3 ? clamp16(v[2]) : r.cur;
    r.avg = got >= 4 ? clamp16(v[3]) : r.cur;
    return r;
}

static void put16(unsigned char *p, unsigned int v)
{
    p[0] = v & 0xff;
    p[1] = (v >> 8) & 0xff;
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = v & 0xff;
    p[1] = (v >> 8) & 0xff;
    p[2] = (v >> 16) & 0xff;
    p[3] = (v >> 24) & 0xff;
}

/* DCMI 1.5, 6.6.1 Get Power Reading: 18 data bytes after the completion code. */
static void power_reading(msg_t *msg, unsigned char *rdata, unsigned int *rdata_len)
{
    struct reading r;

    if (msg->len < 4) {
        rdata[0] = CC_REQ_LEN_INVALID;
        *rdata_len = 1;
        return;
    }
    r = read_watts();
    if (r.kind == READING_ERROR) {
        rdata[0] = CC_NOT_IN_STATE;
        *rdata_len = 1;
        return;
    }
    rdata[0] = CC_OK;
    rdata[1] = DCMI_GROUP_ID;
    if (r.kind == READING_SHORT) {
        rdata[2] = 0x9b;                /* half a power field, then nothing */
        *rdata_len = 3;
        return;
    }
    put16(rdata + 2, r.cur);
    put16(rdata + 4, r.min);
    put16(rdata + 6, r.max);
    put16(rdata + 8, r.avg);
    put32(rdata + 10, (uint32_t) time(NULL));
    put32(rdata + 14, SAMPLE_PERIOD_MS);
    rdata[18] = r.kind == READING_OK ? DCMI_STATE_ACTIVE : 0;
    *rdata_len = 19;
}

/* DCMI 1.5, 6.1.1 Get DCMI Capabilities Info, parameter 1 (supported capabilities). */
static void capabilities(msg_t *msg, unsigned char *rdata, unsigned int *rdata_len)
{
    if (msg->len < 2 || msg->data[1] != 1) {
        rdata[0] = CC_INVALID_CMD;
        *rdata_len = 1;
        return;
    }
    rdata[0] = CC_OK;
    rdata[1] = DCMI_GROUP_ID;
    rdata[2] = 1;                       /* DCMI 1.5 */
    rdata[3] = 5;
    rdata[4] = 2;                       /* parameter revision */
    rdata[5] = 0;                       /* reserved */
    rdata[6] = 0x01;                    /* power management supported */
    rdata[7] = 0;
    rdata[8] = 0;
    *rdata_len = 9;
}

static void handle_dcmi(lmc_data_t *mc, msg_t *msg, unsigned char *rdata,
                        unsigned int *rdata_len, void *cb_data)
{
    (void) mc;
    (void) cb_data;
    switch (msg->cmd) {
    case DCMI_CMD_GET_POWER_READING:
        power_reading(msg, rdata, rdata_len);
        break;
    case DCMI_CMD_GET_CAPABILITIES:
        capabilities(msg, rdata, rdata_len);
        break;
    default:
        rdata[0] = CC_INVALID_CMD;
        *rdata_len = 1;
    }
}

int ipmi_sim_module_print_version(sys_data_t *sys, char *options)
{
    (void) sys;
    (void) options;
    printf("opsloop dcmi_power 1.0\n");
    return 0;
}

int ipmi_sim_module_init(sys_data_t *sys, const char *options)
{
    const char *key = "watts_file=";
    const char *at = options ? strstr(options, key) : NULL;
    size_t len;

    sim = sys;
    if (!at) {
        sys->log(sys, SETUP_ERROR, NULL, "dcmi_power: option watts_file=PATH is required");
        return EINVAL;
    }
    at += strlen(key);
    len = strcspn(at, " \t");
    if (len == 0 || len >= sizeof(watts_file)) {
        sys->log(sys, SETUP_ERROR, NULL, "dcmi_power: watts_file path empty or too long");
        return EINVAL;
    }
    memcpy(watts_file, at, len);
    watts_file[len] = '\0';
    ipmi_emu_register_group_extension_handler(DCMI_GROUP_ID, handle_dcmi, NULL);
    return 0;
}
