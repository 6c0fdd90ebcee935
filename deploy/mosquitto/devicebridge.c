/*
 * devicebridge.so: a Mosquitto 2.0 plugin (plugin API version 5) that lets
 * the devicebridge bridge reach xiaozhi boards on firmware 1.0 and later,
 * which never send SUBSCRIBE.
 *
 *   Downlink   The bridge publishes a board's message to devices/p2p/<key>
 *              (key: the board's MAC with '_', aa_bb_cc_dd_ee_ff). The
 *              plugin queues it for that board's connected client alone
 *              (mosquitto_broker_publish_copy with its client id) and drops
 *              the original. Only the bridge's account may publish there.
 *   Probe      A publish of the bridge to devicebridge/probe comes back to
 *              the bridge's own client the same way: the bridge's proof
 *              that this plugin is loaded.
 *   Auth       A client whose id names a board (GROUP@@@<mac>[@@@<uuid>])
 *              logs in with the password the bridge's OTA issued, derived
 *              from the bridge's secret (plugin_opt_secret_file):
 *              base64url(HMAC-SHA256(secret, "devicebridge/mqtt-password"
 *              0 <mac aa:bb:..> 0 <username>)), or the xiaozhi form
 *              base64(HMAC-SHA256(secret, client_id "|" username)). The
 *              bridge logs in as plugin_opt_bridge_username with
 *              plugin_opt_bridge_password, or, without one, the password
 *              derived from the secret (devicebridge/mqtt-bridge-password).
 *              Everything else is deferred to Mosquitto's own checks.
 *   ACL        A board publishes only to devices/up/<its key>, never
 *              retained, and never subscribes. Nobody but the bridge reads
 *              devices/up/# or writes devices/up/# and devices/p2p/#.
 *
 * Bounds: the board table holds only connected, authenticated boards (an
 * entry is removed on disconnect, and the table refuses boards past
 * plugin_opt_max_boards); no message allocates anything here beyond what
 * mosquitto_broker_publish_copy queues. Every length from a client is
 * checked before use. Topic rewrites are avoided on purpose (they leak or
 * double-free depending on the 2.0.x release).
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

#define PLUGIN_NAME "devicebridge"
#define PLUGIN_VERSION "1"

#define UPLINK_PREFIX "devices/up/"
#define DOWNLINK_PREFIX "devices/p2p/"
#define PROBE_TOPIC "devicebridge/probe"

#define KEY_LEN 17             /* aa_bb_cc_dd_ee_ff */
#define MAX_CLIENT_ID 256      /* longer board ids are refused */
#define MAX_SECRET 512         /* bytes after hex decoding */
#define MAX_CREDENTIAL 256     /* username or password of a board */
#define BUCKETS 4096
#define DEFAULT_MAX_BOARDS 100000

/* Kinds of warnings, each throttled on its own. */
enum warning { W_BRIDGE, W_ID, W_CREDENTIALS, W_FULL, W_DENIED, W_KINDS };

struct board {
	char key[KEY_LEN + 1];
	const struct mosquitto *client; /* identity only, never dereferenced */
	char *client_id;
	struct board *next;
};

struct plugin {
	mosquitto_plugin_id_t *id;
	unsigned char secret[MAX_SECRET];
	size_t secret_len;
	char *bridge_username;
	char *bridge_password;
	bool others_allowed; /* other clients: allowed outside devices/ (else deferred) */
	long max_boards;
	long boards;
	struct board *buckets[BUCKETS];
	time_t last_warning[W_KINDS];
	unsigned long warnings_skipped[W_KINDS];
};

static struct plugin *plug;

/* ---- helpers ---- */

/* warn logs at most one warning a second: a client can repeat the cause at
 * will. */
__attribute__((format(printf, 2, 3)))
static void warn(enum warning kind, const char *fmt, ...)
{
	time_t now = time(NULL);
	if(now == plug->last_warning[kind]){
		plug->warnings_skipped[kind]++;
		return;
	}
	plug->last_warning[kind] = now;
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if(plug->warnings_skipped[kind] > 0){
		mosquitto_log_printf(MOSQ_LOG_WARNING, PLUGIN_NAME ": %s (and %lu more like it since the last)", line, plug->warnings_skipped[kind]);
	}else{
		mosquitto_log_printf(MOSQ_LOG_WARNING, PLUGIN_NAME ": %s", line);
	}
	plug->warnings_skipped[kind] = 0;
}

static int hexval(int c)
{
	if(c >= '0' && c <= '9') return c - '0';
	if(c >= 'a' && c <= 'f') return c - 'a' + 10;
	if(c >= 'A' && c <= 'F') return c - 'A' + 10;
	return -1;
}

/* canonical_key reads a MAC in any spelling the bridge accepts (hex digits
 * with ':', '-', '_' or '.') of exactly n bytes, and writes its topic key
 * (aa_bb_cc_dd_ee_ff) and device id (aa:bb:cc:dd:ee:ff). */
static bool canonical_key(const char *s, size_t n, char key[KEY_LEN + 1], char mac[KEY_LEN + 1])
{
	char d[12];
	size_t nd = 0;
	for(size_t i = 0; i < n; i++){
		int c = (unsigned char)s[i];
		if(c == ':' || c == '-' || c == '_' || c == '.') continue;
		if(hexval(c) < 0 || nd == sizeof(d)) return false;
		d[nd++] = (char)tolower(c);
	}
	if(nd != sizeof(d)) return false;
	for(int i = 0; i < 6; i++){
		key[3*i] = mac[3*i] = d[2*i];
		key[3*i+1] = mac[3*i+1] = d[2*i+1];
		if(i < 5){
			key[3*i+2] = '_';
			mac[3*i+2] = ':';
		}
	}
	key[KEY_LEN] = mac[KEY_LEN] = '\0';
	return true;
}

enum idkind { ID_OTHER, ID_BOARD, ID_BAD };

/* parse_client_id: GROUP@@@<mac> or GROUP@@@<mac>@@@<uuid> names a board;
 * an id holding "@@@" in any other shape is refused; anything else is not
 * the plugin's business. */
static enum idkind parse_client_id(const char *id, char key[KEY_LEN + 1], char mac[KEY_LEN + 1])
{
	if(!id) return ID_OTHER;
	const char *a = strstr(id, "@@@");
	if(!a) return ID_OTHER;
	if(strlen(id) > MAX_CLIENT_ID || a == id) return ID_BAD;
	const char *m = a + 3;
	const char *b = strstr(m, "@@@");
	size_t mlen = b ? (size_t)(b - m) : strlen(m);
	if(b){
		const char *u = b + 3;
		if(*u == '\0' || strstr(u, "@@@")) return ID_BAD;
	}
	return canonical_key(m, mlen, key, mac) ? ID_BOARD : ID_BAD;
}

static void b64(const unsigned char *in, size_t n, char *out, bool url)
{
	const char *std = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	const char *urls = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	const char *t = url ? urls : std;
	size_t o = 0, i = 0;
	for(; i + 2 < n; i += 3){
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i+1] << 8 | in[i+2];
		out[o++] = t[v >> 18 & 63];
		out[o++] = t[v >> 12 & 63];
		out[o++] = t[v >> 6 & 63];
		out[o++] = t[v & 63];
	}
	if(i < n){
		uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i+1] << 8 : 0);
		out[o++] = t[v >> 18 & 63];
		out[o++] = t[v >> 12 & 63];
		if(i + 1 < n){
			out[o++] = t[v >> 6 & 63];
		}else if(!url){
			out[o++] = '=';
		}
		if(!url) out[o++] = '=';
	}
	out[o] = '\0';
}

/* hmac64 writes base64 (url: base64url without padding) of
 * HMAC-SHA256(secret, msg). out: at least 45 bytes. */
static bool hmac64(const unsigned char *msg, size_t n, char out[64], bool url)
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int len = 0;
	if(!HMAC(EVP_sha256(), plug->secret, (int)plug->secret_len, msg, n, mac, &len) || len != 32){
		return false;
	}
	b64(mac, len, out, url);
	return true;
}

/* derive is the bridge's ota.Credentials derivation: base64url, no padding,
 * of HMAC-SHA256(secret, purpose 0 part1 [0 part2]). */
static bool derive(const char *purpose, const char *p1, const char *p2, char out[64])
{
	unsigned char msg[64 + MAX_CREDENTIAL + 1 + MAX_CREDENTIAL + 1];
	size_t a = strlen(purpose), b = strlen(p1), c = p2 ? strlen(p2) : 0, n = 0;
	if(a > 64 || b > MAX_CREDENTIAL || c > MAX_CREDENTIAL) return false;
	memcpy(msg, purpose, a);
	n = a;
	msg[n++] = 0;
	memcpy(msg + n, p1, b);
	n += b;
	if(p2){
		msg[n++] = 0;
		memcpy(msg + n, p2, c);
		n += c;
	}
	return hmac64(msg, n, out, true);
}

/* xiaozhi is mqtt.HMACPassword: base64(HMAC-SHA256(secret, id "|" user)). */
static bool xiaozhi(const char *client_id, const char *username, char out[64])
{
	size_t a = strlen(client_id), b = strlen(username);
	unsigned char msg[MAX_CLIENT_ID + 1 + MAX_CREDENTIAL + 1];
	if(a > MAX_CLIENT_ID || b > MAX_CREDENTIAL) return false;
	memcpy(msg, client_id, a);
	msg[a] = '|';
	memcpy(msg + a + 1, username, b);
	return hmac64(msg, a + 1 + b, out, false);
}

/* equal compares in constant time for equal lengths. */
static bool equal(const char *a, const char *b)
{
	size_t n = strlen(a);
	return n == strlen(b) && CRYPTO_memcmp(a, b, n) == 0;
}

/* ---- board table ---- */

static unsigned bucket(const char *key)
{
	uint32_t h = 2166136261u;
	for(const char *p = key; *p; p++){
		h = (h ^ (unsigned char)*p) * 16777619u;
	}
	return h % BUCKETS;
}

static struct board *find(const char *key)
{
	for(struct board *b = plug->buckets[bucket(key)]; b; b = b->next){
		if(!strcmp(b->key, key)) return b;
	}
	return NULL;
}

/* put records the board's current connection: a newer one replaces the
 * older (the older one's disconnect then finds nothing of its own). */
static bool put(const char *key, const struct mosquitto *client, const char *client_id)
{
	struct board *b = find(key);
	char *id = strdup(client_id);
	if(!id) return false;
	if(b){
		free(b->client_id);
		b->client_id = id;
		b->client = client;
		return true;
	}
	if(plug->boards >= plug->max_boards){
		free(id);
		return false;
	}
	b = calloc(1, sizeof(*b));
	if(!b){
		free(id);
		return false;
	}
	memcpy(b->key, key, KEY_LEN + 1);
	b->client = client;
	b->client_id = id;
	unsigned h = bucket(key);
	b->next = plug->buckets[h];
	plug->buckets[h] = b;
	plug->boards++;
	return true;
}

static void drop(const char *key, const struct mosquitto *client)
{
	struct board **pp = &plug->buckets[bucket(key)];
	for(; *pp; pp = &(*pp)->next){
		struct board *b = *pp;
		if(strcmp(b->key, key)) continue;
		if(b->client != client) return; /* a newer connection of the board */
		*pp = b->next;
		free(b->client_id);
		free(b);
		plug->boards--;
		return;
	}
}

/* board_of reports whether client is an admitted board, and its key. */
static bool board_of(const struct mosquitto *client, char key[KEY_LEN + 1])
{
	char mac[KEY_LEN + 1];
	if(parse_client_id(mosquitto_client_id(client), key, mac) != ID_BOARD) return false;
	struct board *b = find(key);
	return b && b->client == client;
}

static bool is_bridge(const struct mosquitto *client)
{
	const char *u = mosquitto_client_username(client);
	return u && !strcmp(u, plug->bridge_username);
}

static bool has_prefix(const char *s, const char *p) { return s && !strncmp(s, p, strlen(p)); }

/* ---- callbacks ---- */

static int on_basic_auth(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_basic_auth *ed = event_data;
	(void)event; (void)userdata;
	const char *id = mosquitto_client_id(ed->client);
	const char *user = ed->username, *pass = ed->password;
	if(!id) id = "";
	char key[KEY_LEN + 1], mac[KEY_LEN + 1];

	if(user && !strcmp(user, plug->bridge_username)){
		if(pass && equal(pass, plug->bridge_password)) return MOSQ_ERR_SUCCESS;
		warn(W_BRIDGE, "refused the bridge's username with a wrong password (client id %s)", id);
		return MOSQ_ERR_AUTH;
	}
	switch(parse_client_id(id, key, mac)){
	case ID_OTHER:
		return MOSQ_ERR_PLUGIN_DEFER;
	case ID_BAD:
		warn(W_ID, "refused client %s: its id holds @@@ but names no board (GROUP@@@<mac>[@@@<uuid>])", id);
		return MOSQ_ERR_AUTH;
	case ID_BOARD:
		break;
	}
	if(!user || !pass || strlen(user) > MAX_CREDENTIAL || strlen(pass) > MAX_CREDENTIAL){
		warn(W_CREDENTIALS, "refused board %s: no credentials, or too long (boot it through the bridge's OTA)", id);
		return MOSQ_ERR_AUTH;
	}
	char want[64], alt[64];
	bool ok = derive("devicebridge/mqtt-password", mac, user, want) && equal(pass, want);
	ok = (xiaozhi(id, user, alt) && equal(pass, alt)) || ok;
	if(!ok){
		warn(W_CREDENTIALS, "refused board %s: wrong password for its MAC (credentials issued to another board, or another secret) user %s", id, user);
		return MOSQ_ERR_AUTH;
	}
	if(!put(key, ed->client, id)){
		warn(W_FULL, "refused board %s: plugin_opt_max_boards boards are connected", id);
		return MOSQ_ERR_AUTH;
	}
	return MOSQ_ERR_SUCCESS;
}

static int on_disconnect(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_disconnect *ed = event_data;
	char key[KEY_LEN + 1], mac[KEY_LEN + 1];
	(void)event; (void)userdata;
	if(parse_client_id(mosquitto_client_id(ed->client), key, mac) == ID_BOARD){
		drop(key, ed->client);
	}
	return MOSQ_ERR_SUCCESS;
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_acl_check *ed = event_data;
	char key[KEY_LEN + 1];
	(void)event; (void)userdata;
	const char *topic = ed->topic ? ed->topic : "";
	bool ours = has_prefix(topic, UPLINK_PREFIX) || has_prefix(topic, DOWNLINK_PREFIX);

	if(is_bridge(ed->client)) return MOSQ_ERR_SUCCESS;
	if(board_of(ed->client, key)){
		if(ed->access == MOSQ_ACL_WRITE && has_prefix(topic, UPLINK_PREFIX)
				&& !strcmp(topic + strlen(UPLINK_PREFIX), key) && !ed->retain){
			return MOSQ_ERR_SUCCESS;
		}
		if(ed->access == MOSQ_ACL_WRITE){
			warn(W_DENIED, "denied board %s a publish to %s (only its own devices/up/<mac>, not retained)", mosquitto_client_id(ed->client), topic);
		}
		return MOSQ_ERR_ACL_DENIED;
	}
	if(ours && (ed->access == MOSQ_ACL_READ || ed->access == MOSQ_ACL_WRITE)){
		return MOSQ_ERR_ACL_DENIED;
	}
	return plug->others_allowed ? MOSQ_ERR_SUCCESS : MOSQ_ERR_PLUGIN_DEFER;
}

static int on_message(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_message *ed = event_data;
	(void)event; (void)userdata;
	const char *topic = ed->topic ? ed->topic : "";
	if(!is_bridge(ed->client)) return MOSQ_ERR_SUCCESS; /* the ACL already decided */
	if(ed->payloadlen > INT32_MAX) return MOSQ_ERR_ACL_DENIED;
	int qos = ed->qos > 1 ? 1 : ed->qos;
	if(!strcmp(topic, PROBE_TOPIC)){
		mosquitto_broker_publish_copy(mosquitto_client_id(ed->client), PROBE_TOPIC, (int)ed->payloadlen, ed->payload, qos, false, NULL);
		return MOSQ_ERR_ACL_DENIED;
	}
	if(!has_prefix(topic, DOWNLINK_PREFIX)) return MOSQ_ERR_SUCCESS;
	const char *key = topic + strlen(DOWNLINK_PREFIX);
	if(strlen(key) == KEY_LEN){
		struct board *b = find(key);
		if(b){
			mosquitto_broker_publish_copy(b->client_id, topic, (int)ed->payloadlen, ed->payload, qos, false, NULL);
		}
	}
	/* Delivered to the board alone, or to nobody: never to subscribers. */
	return MOSQ_ERR_ACL_DENIED;
}

/* ---- set-up ---- */

static bool load_secret(const char *path)
{
	FILE *f = fopen(path, "r");
	if(!f){
		mosquitto_log_printf(MOSQ_LOG_ERR, PLUGIN_NAME ": cannot open plugin_opt_secret_file %s", path);
		return false;
	}
	char buf[2 * MAX_SECRET + 8];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	bool more = fgetc(f) != EOF;
	fclose(f);
	while(n > 0 && (buf[n-1] == '\n' || buf[n-1] == '\r' || buf[n-1] == ' ')) n--;
	if(more || n % 2 != 0 || n / 2 < 16 || n / 2 > MAX_SECRET){
		mosquitto_log_printf(MOSQ_LOG_ERR, PLUGIN_NAME ": %s: want the bridge's secret, 16 to %d bytes as hex (its ota-secret file)", path, MAX_SECRET);
		return false;
	}
	for(size_t i = 0; i < n; i += 2){
		int h = hexval((unsigned char)buf[i]), l = hexval((unsigned char)buf[i+1]);
		if(h < 0 || l < 0){
			mosquitto_log_printf(MOSQ_LOG_ERR, PLUGIN_NAME ": %s is not hex", path);
			OPENSSL_cleanse(buf, sizeof(buf));
			return false;
		}
		plug->secret[i/2] = (unsigned char)(h << 4 | l);
	}
	plug->secret_len = n / 2;
	OPENSSL_cleanse(buf, sizeof(buf));
	return true;
}

static void free_plugin(void)
{
	if(!plug) return;
	for(int i = 0; i < BUCKETS; i++){
		struct board *b = plug->buckets[i];
		while(b){
			struct board *next = b->next;
			free(b->client_id);
			free(b);
			b = next;
		}
	}
	free(plug->bridge_username);
	if(plug->bridge_password){
		OPENSSL_cleanse(plug->bridge_password, strlen(plug->bridge_password));
		free(plug->bridge_password);
	}
	OPENSSL_cleanse(plug->secret, sizeof(plug->secret));
	free(plug);
	plug = NULL;
}

int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
	for(int i = 0; i < supported_version_count; i++){
		if(supported_versions[i] == 5) return 5;
	}
	return -1;
}

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata, struct mosquitto_opt *options, int option_count)
{
	const char *secret_file = NULL, *user = NULL, *pass = NULL, *max = NULL, *others = NULL;
	if(plug){
		mosquitto_log_printf(MOSQ_LOG_ERR, PLUGIN_NAME ": loaded twice; load it once (global plugin)");
		return MOSQ_ERR_INVAL;
	}
	for(int i = 0; i < option_count; i++){
		const char *k = options[i].key, *v = options[i].value;
		if(!k || !v) continue;
		if(!strcmp(k, "secret_file")) secret_file = v;
		else if(!strcmp(k, "bridge_username")) user = v;
		else if(!strcmp(k, "bridge_password")) pass = v;
		else if(!strcmp(k, "max_boards")) max = v;
		else if(!strcmp(k, "other_clients")) others = v;
		else{
			mosquitto_log_printf(MOSQ_LOG_ERR, PLUGIN_NAME ": unknown option plugin_opt_%s", k);
			return MOSQ_ERR_INVAL;
		}
	}
	if(!secret_file || !user || !*user){
		mosquitto_log_printf(MOSQ_LOG_ERR, PLUGIN_NAME ": plugin_opt_secret_file and plugin_opt_bridge_username are required");
		return MOSQ_ERR_INVAL;
	}
	plug = calloc(1, sizeof(*plug));
	if(!plug) return MOSQ_ERR_NOMEM;
	plug->id = identifier;
	plug->max_boards = DEFAULT_MAX_BOARDS;
	plug->others_allowed = true;
	if(max){
		char *end = NULL;
		long v = strtol(max, &end, 10);
		if(!end || *end || v < 1 || v > 10000000){
			mosquitto_log_printf(MOSQ_LOG_ERR, PLUGIN_NAME ": plugin_opt_max_boards %s: want 1 to 10000000", max);
			free_plugin();
			return MOSQ_ERR_INVAL;
		}
		plug->max_boards = v;
	}
	if(others){
		if(!strcmp(others, "defer")) plug->others_allowed = false;
		else if(strcmp(others, "allow")){
			mosquitto_log_printf(MOSQ_LOG_ERR, PLUGIN_NAME ": plugin_opt_other_clients %s: want allow or defer", others);
			free_plugin();
			return MOSQ_ERR_INVAL;
		}
	}
	if(!load_secret(secret_file)){
		free_plugin();
		return MOSQ_ERR_INVAL;
	}
	plug->bridge_username = strdup(user);
	char derived[64];
	if(pass){
		plug->bridge_password = strdup(pass);
	}else if(derive("devicebridge/mqtt-bridge-password", user, NULL, derived)){
		plug->bridge_password = strdup(derived);
	}
	if(!plug->bridge_username || !plug->bridge_password){
		free_plugin();
		return MOSQ_ERR_NOMEM;
	}
	if(mosquitto_callback_register(identifier, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, NULL)
			|| mosquitto_callback_register(identifier, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, NULL)
			|| mosquitto_callback_register(identifier, MOSQ_EVT_MESSAGE, on_message, NULL, NULL)
			|| mosquitto_callback_register(identifier, MOSQ_EVT_DISCONNECT, on_disconnect, NULL, NULL)){
		mosquitto_log_printf(MOSQ_LOG_ERR, PLUGIN_NAME ": could not register its callbacks");
		free_plugin();
		return MOSQ_ERR_UNKNOWN;
	}
	*userdata = plug;
	mosquitto_log_printf(MOSQ_LOG_NOTICE, PLUGIN_NAME " plugin " PLUGIN_VERSION " loaded: bridge user %s, downlink " DOWNLINK_PREFIX
			"<mac> delivered to boards that never subscribe, uplink " UPLINK_PREFIX "<mac>", user);
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *options, int option_count)
{
	(void)userdata; (void)options; (void)option_count;
	if(!plug) return MOSQ_ERR_SUCCESS;
	mosquitto_callback_unregister(plug->id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
	mosquitto_callback_unregister(plug->id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
	mosquitto_callback_unregister(plug->id, MOSQ_EVT_MESSAGE, on_message, NULL);
	mosquitto_callback_unregister(plug->id, MOSQ_EVT_DISCONNECT, on_disconnect, NULL);
	free_plugin();
	return MOSQ_ERR_SUCCESS;
}
