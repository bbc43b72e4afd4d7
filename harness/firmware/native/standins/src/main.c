/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): the program entry point.
 * ESP-IDF starts FreeRTOS and calls app_main() in the main task; here main() calls it directly.
 * stdout is unbuffered, as a UART is: what the firmware printed before a crash is never lost, and
 * it interleaves with sanitizer reports on stderr in the order things happened. */
#include <stdio.h>

void app_main(void);
void esp_check_standins_start(void);

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    esp_check_standins_start();
    printf("I (0) esp-check-native: host program built from the firmware sources with ESP-IDF stand-ins "
           "(no ESP-IDF, no chip)\r\n");
    app_main();
    return 0;
}
